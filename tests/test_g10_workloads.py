"""G10's workloads (benchmarks/g10_models.py): the two models written for them build with the
published parameter counts and trace at a tiny batch; the G10 machine file loads."""

import pytest

torch = pytest.importorskip("torch", reason="the G10 models need torch (pip install -e '.[trace]')")

from benchmarks import g10_models  # noqa: E402
from simulator.hardware import load_hardware  # noqa: E402


def params(net) -> int:
    return sum(p.numel() for p in net.parameters())


@pytest.mark.parametrize("name, count", [
    ("inception_v3", 23_834_568),       # published 23.8M without the auxiliary classifier
    ("inception_v3_aux", 27_161_264),   # torchvision's 27.2M with it
    ("senet154", 115_088_984),          # published 115.1M
])
def test_parameter_counts(name, count):
    net, inputs, loss_fn, targets = getattr(g10_models, name)(batch=2)
    assert params(net) == count
    assert inputs[0].shape == (2, 3, 299 if "inception" in name else 224, 299 if "inception" in name else 224)
    assert targets[0].shape == (2,) and callable(loss_fn)


@pytest.mark.parametrize("name, seq, outputs", [("inception_v3", 299, 1), ("inception_v3_aux", 299, 2),
                                                 ("senet154", 224, 1)])
def test_forward_shapes_on_meta(name, seq, outputs):
    net, inputs, loss_fn, targets = getattr(g10_models, name)(batch=2, seq=seq)
    out = net(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    assert len(out) == outputs and all(o.shape == (2, 1000) for o in out)
    assert loss_fn(out[0] if outputs == 1 else out, *targets).shape == ()


@pytest.mark.parametrize("name, ops_at_least", [("inception_v3", 900),
                                                 pytest.param("senet154", 2500, marks=pytest.mark.slow)])
def test_traces_at_batch_2(name, ops_at_least):
    """Each model traces at batch 2 with its weights counted; `make test` traces Inception
    v3 (the tracer on a branching graph), `make test-slow` also SENet-154 (three times the ops)."""
    from tracer.pytorch.trace import trace
    profile = trace(f"benchmarks.g10_models:{name}", batch=2, optimizer="sgd")
    weights = sum(t.bytes for t in profile.tensors if t.kind == "weight")
    count = {"inception_v3": 23_834_568, "senet154": 115_088_984}[name]
    assert len(profile.ops) >= ops_at_least
    # fp32 weights, plus batch-norm running statistics (buffers count as weights)
    assert count * 4 <= weights < count * 4 * 1.01
    assert profile.source["batch"] == 2


def test_g10_preset():
    hw = load_hardware("a100-40gb-128gb-g10")
    assert hw.gpu.memory_bytes == 40 * 2**30 and hw.host.memory_bytes == 128 * 2**30
    assert (hw.pcie.h2d_gbps, hw.pcie.d2h_gbps) == (15.754, 15.754)
    assert (hw.ssd.read_gbps, hw.ssd.write_gbps) == (3.2, 3.2)
    assert hw.uvm.fault_latency_us == 45 and hw.uvm.backing == "ssd" and hw.uvm.host_cache_bytes == 128 * 2**30
