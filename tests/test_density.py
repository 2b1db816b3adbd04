"""Tensor densities: measured by ``trace(..., density=True)`` (``swapplan trace --density``)
on a real CPU step, or read from a ``--density-file`` (trace and import kineto).

The key check (``test_relu_mlp_densities_match_a_direct_count``) runs a small ReLU MLP
with torch itself, on the weights and batch the tracer's step uses, counts the non-zero
elements of its ReLU outputs and gradients, and compares them with the profile's.
"""
from __future__ import annotations

import gzip
import importlib.util
import json

import pytest
from click.testing import CliRunner

from cli import app
from simulator.errors import InputError
from simulator.profile import load_profile, profile_bytes, save_profile
from tracer.density import read_density_file, with_densities, write_density_file

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="measuring densities needs torch (the 'trace' extra)")

ME = __name__   # models below are reached as "tests.test_density:<function>"
IN, HIDDEN, CLASSES = 32, 64, 10


def run(*args):
    return CliRunner().invoke(app, list(args), obj={})


# ----------------------------------------------------------------------------- models


def relu_mlp(batch=16):
    """Linear-ReLU-Linear-ReLU(in place)-Linear with cross entropy, real weights (the
    tracer moves the module to meta; the density step uses it as built)."""
    import torch
    from torch import nn
    net = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(inplace=True),
                        nn.Linear(HIDDEN, CLASSES))
    return (net, (torch.empty(batch, IN),), torch.nn.functional.cross_entropy,
            (torch.empty(batch, dtype=torch.long),))


def transposing(batch=8):
    """A model whose graph depends on the batch: ``x.t().contiguous()`` copies x, except
    at batch 1, where the transpose is contiguous already and no copy is made."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(batch, 4)

        def forward(self, x):
            return self.lin(x.t().contiguous())

    return Net(), (torch.empty(batch, 16),)


def _direct(batch: int, seed: int = 0) -> dict:
    """What the tracer's density step computes, with torch directly: the model as its
    callable builds it after ``torch.manual_seed(seed)``, the batch from a generator seeded
    with ``seed + 1`` (floating: normal; targets: 0 or 1, the user model gives no class
    count), one forward and backward. Returns the densities by profile tensor name: of the
    tensors whose size scales with the batch, and of those that sum over it (weight
    gradients, optimizer state)."""
    import torch
    torch.manual_seed(seed)
    net = relu_mlp(batch)[0]
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn((batch, IN), generator=gen)
    y = torch.randint(0, 2, (batch,), generator=gen)
    h1 = torch.relu(net[0](x))
    h1.retain_grad()
    h2 = torch.relu(net[2](h1))
    loss = torch.nn.functional.cross_entropy(net[4](h2), y)
    loss.backward()

    def density(t):
        return torch.count_nonzero(t).item() / t.numel()
    per_sample = {"1.relu": density(h1), "2.addmm": density(h2),   # relu_ runs in place into 2's output
                  "1.threshold_backward": density(h1.grad * (h1 > 0)), "batch.target0": density(y)}
    summed = {"0.weight.grad": density(net[0].weight.grad), "2.weight.grad": density(net[2].weight.grad),
              "2.bias.grad": density(net[2].bias.grad),
              "0.weight.exp_avg": density(net[0].weight.grad)}   # AdamW's first moment: (1 - beta1) x grad
    return per_sample, summed


# ----------------------------------------------------------------------------- measured


@pytest.fixture(scope="module")
def measured():
    if not HAS_TORCH:
        pytest.skip("measuring densities needs torch (the 'trace' extra)")
    from tracer.pytorch.trace import trace
    return trace(f"{ME}:relu_mlp", batch=16, density=True)


@needs_torch
def test_relu_mlp_densities_match_a_direct_count(measured):
    assert measured.source["density"]["batch"] == 4   # min(16, 4) by default
    by_name = {t.name: t for t in measured.tensors}
    per_sample, summed = _direct(batch=4)
    for name, density in per_sample.items():
        assert by_name[name].density == pytest.approx(density, abs=1e-4), name
    assert 0.3 < by_name["1.relu"].density < 0.7      # a fresh ReLU layer: about half non-zero
    # measured at batch 4 of 16: what sums over the batch has no density, the rest has one
    for t in measured.tensors:
        scales = t.kind in ("activation", "input") or (t.kind == "gradient" and not t.name.endswith(".grad"))
        assert (t.density is not None) == (scales and t.shape not in ((), None)), t.name
    assert "unmeasured" in measured.source["density"]


@needs_torch
def test_density_batch_equal_to_the_batch_and_seeds():
    from tracer.pytorch.trace import trace
    full = trace(f"{ME}:relu_mlp", batch=8, density=True, density_batch=8)
    assert full.source["density"] == {**full.source["density"], "batch": 8, "seed": 0, "threads": 2, "digits": 4}
    assert "unmeasured" not in full.source["density"]
    assert all(t.density is not None for t in full.tensors)   # at the traced batch: every tensor
    by_name = {t.name: t for t in full.tensors}
    per_sample, summed = _direct(batch=8)
    for name, density in {**per_sample, **summed}.items():
        assert by_name[name].density == pytest.approx(density, abs=1e-4), name
    assert by_name["2.weight.exp_avg"].density == by_name["2.weight.grad"].density
    other = trace(f"{ME}:relu_mlp", batch=8, density=True, density_batch=8, density_seed=3)
    by_name = {t.name: t for t in other.tensors}
    per_sample, summed = _direct(batch=8, seed=3)
    for name, density in {**per_sample, **summed}.items():
        assert by_name[name].density == pytest.approx(density, abs=1e-4), name


@needs_torch
def test_densities_are_deterministic_and_only_add_density(measured):
    from tracer.pytorch.trace import trace
    again = trace(f"{ME}:relu_mlp", batch=16, density=True)
    assert profile_bytes(again) == profile_bytes(measured)
    plain = trace(f"{ME}:relu_mlp", batch=16)
    stripped = with_densities(measured, {t.id: None for t in measured.tensors})
    source = dict(stripped.source)
    del source["density"]
    assert source == plain.source
    assert [t.to_dict() for t in stripped.tensors] == [t.to_dict() for t in plain.tensors]
    assert [o.to_dict() for o in stripped.ops] == [o.to_dict() for o in plain.ops]
    for t in measured.tensors:
        assert t.density is None or round(t.density, 4) == t.density


@needs_torch
def test_the_graph_must_be_the_same_at_the_density_batch():
    from tracer.pytorch.trace import trace
    profile = trace(f"{ME}:transposing", batch=8, density=True, density_batch=2)
    assert profile.source["density"]["batch"] == 2
    with pytest.raises(InputError) as err:
        trace(f"{ME}:transposing", batch=8, density=True, density_batch=1)
    assert err.value.where == "density-batch"
    assert "differs from the traced one at batch 8" in err.value.problem and "tensors" in err.value.problem
    with pytest.raises(InputError, match="more than the traced batch"):
        trace(f"{ME}:relu_mlp", batch=4, density=True, density_batch=5)


@needs_torch
def test_the_cli_measures_and_writes_a_density_file(tmp_path, measured):
    out, dens = tmp_path / "mlp.json", tmp_path / "dens.json"
    result = run("trace", f"{ME}:relu_mlp", "--batch", "16", "--density", "--density-out", str(dens), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert f"densities of {sum(t.density is not None for t in measured.tensors)} tensors" in result.output
    assert "measuring densities: one CPU step at batch 4 on 2 threads" in result.output   # progress
    profile = load_profile(out)
    assert profile.sha256 == measured.sha256
    assert json.loads(dens.read_text()) == {t.id: t.density for t in measured.tensors if t.density is not None}
    # a density file from a measured trace sets the same densities on a plain one
    again = tmp_path / "again.json"
    result = run("trace", f"{ME}:relu_mlp", "--batch", "16", "--density-file", str(dens), "-o", str(again))
    assert result.exit_code == 0, result.output
    read = load_profile(again)
    assert [t.density for t in read.tensors] == [t.density for t in measured.tensors]
    assert read.source["density"] == {"file": str(dens)}


@needs_torch
def test_cli_density_errors(tmp_path):
    out = str(tmp_path / "x.json")
    result = run("trace", f"{ME}:relu_mlp", "--density-batch", "2", "-o", out)
    assert result.exit_code == 2 and "--density" in result.output
    result = run("trace", f"{ME}:transposing", "--density", "--density-batch", "1", "-o", out)
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith(
        "error: <argument>: density-batch: the graph at batch 1 differs from the traced one at batch 8 (13 tensors")
    bad = tmp_path / "bad.json"
    bad.write_text('{"t21": 1.25}')
    result = run("trace", f"{ME}:relu_mlp", "--density-file", str(bad), "-o", out)
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == \
        f"error: {bad}: t21: expected a density (fraction of non-zero elements) from 0 to 1, got 1.25"


def seq_dependent(batch=4, seq=8):
    """A model whose graph depends on the sequence length as ``transposing``'s on the
    batch: at seq 1 the transpose is contiguous and no copy is made."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(batch, 4)

        def forward(self, x):
            return torch.relu(self.lin(x.t().contiguous())).sum(0)

    return Net(), (torch.empty(batch, seq),)


def test_default_step_sizes():
    from tracer.density import step_sizes
    assert step_sizes("causal-lm", 48, 1024) == (2, [128, 1024])     # 2 x 128 tokens, then the traced seq
    assert step_sizes("masked-lm", 1, 64) == (1, [64])               # never more than traced
    assert step_sizes("vision", 1024, 224) == (4, [224])             # the traced image side
    assert step_sizes(None, 16, None) == (4, [None])                 # a user model: its own seq
    assert step_sizes("causal-lm", 48, 1024, 3, 256) == (3, [256])   # given: only that
    assert step_sizes("causal-lm", 48, 1024, density_batch=8) == (8, [128, 1024])


@needs_torch
def test_a_default_shorter_seq_whose_graph_differs_gives_way_to_the_traced_one(monkeypatch):
    from tracer import density
    from tracer.pytorch.trace import trace
    monkeypatch.setattr(density, "step_sizes", lambda kind, b, s, db=None, ds=None: (2, [1, s]))
    profile = trace(f"{ME}:seq_dependent", batch=4, seq=8, density=True)
    assert (profile.source["density"]["batch"], profile.source["density"]["seq"]) == (2, 8)
    monkeypatch.setattr(density, "step_sizes", lambda kind, b, s, db=None, ds=None: (2, [1]))
    with pytest.raises(InputError, match="the graph at batch 2, seq 1 differs from the traced one at batch 4, "
                                         "seq 8"):
        trace(f"{ME}:seq_dependent", batch=4, seq=8, density=True)


@needs_torch
def test_only_what_the_counted_tensors_need_runs_and_counts_the_same():
    """At a smaller batch only activations are counted: the weight gradients and the
    optimizer step do not run and the optimizer state gets no memory, yet every count
    equals that of a run of every node (the in-place ReLU and accumulations included)."""
    from tracer.pytorch.values import seeded_values
    from tracer import density, models
    from tracer.pytorch.trace import capture, lower
    from simulator.hardware import load_hardware

    def step():
        import torch
        workload = models.build(f"{ME}:relu_mlp", batch=4)
        cap = capture(workload)
        tensors, ops = lower(cap, load_hardware("a100-40gb-pcie4"), "fp32", "adamw", runtime=True)
        torch.manual_seed(0)
        return cap, tensors, ops, models.build(f"{ME}:relu_mlp", batch=4, device="cpu")

    cap, tensors, ops, real = step()
    everything = density.measure(cap, tensors, ops, real)
    scaled = {t.id for t in tensors if t.kind in ("activation", "input")
              or (t.kind == "gradient" and not t.name.endswith(".grad"))}
    cap, tensors, ops, real = step()
    some = density.measure(cap, tensors, ops, real, wanted=scaled)
    assert {tid: some[tid] for tid in scaled} == {tid: everything[tid] for tid in scaled}
    assert all(some[t.id] is None for t in tensors if t.id not in scaled)

    gm = cap.graph_module
    inplace = {n for op in ops if op.fx.rewrite == "inplace_accumulate" for n in op.fx.nodes}
    by_node = {}
    for t in tensors:
        if t.id in scaled:
            by_node.setdefault(t.fx.node, t)
    last = {}
    for op in ops:
        for tid in op.outputs + op.updates:
            last[tid] = op
    terminals = set(by_node) | {n for tid in scaled if tid in last for n in last[tid].fx.nodes}
    needed = density.needed_nodes(gm, terminals, inplace)
    ran = {n.target.overloadpacket.__name__ for n in gm.graph.nodes
           if n.name in needed and n.op == "call_function" and hasattr(n.target, "overloadpacket")}
    skipped = {n.target.overloadpacket.__name__ for n in gm.graph.nodes
               if n.name not in needed and n.op == "call_function" and hasattr(n.target, "overloadpacket")}
    assert "relu_" in ran or "relu" in ran
    assert any(name.startswith("_foreach") for name in skipped)        # the optimizer step
    assert "mm" in skipped and "mm" in ran    # the weight gradients; the input gradients run
    assert not density._reads_states([n for n in gm.graph.nodes if n.op == "placeholder"], cap, needed)
    values = seeded_values(cap, real, optimizer_step=False)
    assert all(t.stride() == (0,) * t.dim() for s in values.states for t in s)   # no memory
    assert density.needed_nodes(gm, set()) == set()


# ----------------------------------------------------------------------------- files


@pytest.fixture
def profile(two_layer):
    """The two-layer profile, its second tensor named ``layer1.out``."""
    from dataclasses import replace

    from simulator.profile import Profile
    tensors = list(two_layer.tensors)
    tensors[1] = replace(tensors[1], name="layer1.out")
    return Profile(name=two_layer.name, tensors=tuple(tensors), ops=two_layer.ops, source=two_layer.source)


def _write(tmp_path, data, name="d.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_density_file_by_id_and_by_name(tmp_path, profile):
    ids = [t.id for t in profile.tensors]
    named = profile.tensors[1]
    path = _write(tmp_path, {ids[0]: 0.5, named.name: 1, ids[-1]: 0})
    found = read_density_file(path, profile)
    assert found == {ids[0]: 0.5, named.id: 1.0, ids[-1]: 0.0}
    applied = with_densities(profile, found, {"file": "d.json"})
    assert applied.tensor_by_id[ids[0]].density == 0.5 and applied.source["density"] == {"file": "d.json"}
    assert applied.peak_bytes == profile.peak_bytes and applied.sha256 != profile.sha256


@pytest.mark.parametrize("content, where, words", [
    ('{"nope": 0.5}', "nope", "has no tensor with this id or name"),
    ('{"ID0": 1.5}', "ID0", "from 0 to 1, got 1.5"),
    ('{"ID0": -0.1}', "ID0", "from 0 to 1, got -0.1"),
    ('{"ID0": "0.5"}', "ID0", "from 0 to 1, got \"0.5\""),
    ('{"ID0": true}', "ID0", "from 0 to 1, got true"),
    ('{"ID0": null}', "ID0", "from 0 to 1, got null"),
    ('[0.5]', "", "expected a JSON object"),
    ('{"ID0": 0.5', "line 1", "invalid JSON"),
    ('{"ID0": NaN}', "", "NaN"),
])
def test_density_file_errors(tmp_path, profile, content, where, words):
    path = _write(tmp_path, content.replace("ID0", profile.tensors[0].id))
    with pytest.raises(InputError) as err:
        read_density_file(path, profile)
    assert err.value.file == str(path)
    assert err.value.where.startswith(where.replace("ID0", profile.tensors[0].id))
    assert words in err.value.line()


def test_density_file_name_shared_or_given_twice(tmp_path, profile):
    from dataclasses import replace

    from simulator.profile import Profile
    t0, t1 = profile.tensors[0], profile.tensors[1]
    twins = Profile(name=profile.name, tensors=(replace(t0, name="same"), replace(t1, name="same"),
                                                *profile.tensors[2:]), ops=profile.ops, source=profile.source)
    with pytest.raises(InputError, match=f"2 tensors of profile .* have this name \\({t0.id}, {t1.id}\\): use"):
        read_density_file(_write(tmp_path, {"same": 0.5}), twins)
    named = replace(t0, name="first")
    one = Profile(name=profile.name, tensors=(named, *profile.tensors[1:]), ops=profile.ops, source=profile.source)
    with pytest.raises(InputError, match=f"tensor {t0.id} is given twice"):
        read_density_file(_write(tmp_path, {t0.id: 0.5, "first": 0.25}), one)


def test_profile_round_trip_keeps_density(tmp_path, profile):
    dens = {t.id: round(0.1 * (k % 11), 4) for k, t in enumerate(profile.tensors)}
    applied = with_densities(profile, dens)
    for name in ("p.json", "p.json.gz", "p.yaml"):
        save_profile(applied, tmp_path / name)
        back = load_profile(tmp_path / name)
        assert {t.id: t.density for t in back.tensors} == dens
        assert back.sha256 == applied.sha256
    data = json.loads(gzip.decompress((tmp_path / "p.json.gz").read_bytes()))
    assert [t.get("density") for t in data["tensors"]] == list(dens.values())
    write_density_file(applied, tmp_path / "out.json")
    assert read_density_file(tmp_path / "out.json", profile) == dens


def test_import_kineto_density_file(tmp_path):
    from tests.test_import_kineto import _one_step, _write as write_trace
    trace = write_trace(tmp_path, _one_step("new"))
    good = _write(tmp_path, {"t1": 0.5, "aten::addmm": 1})
    out = tmp_path / "k.json"
    result = run("import", "kineto", str(trace), "--density-file", str(good), "-o", str(out))
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    assert {t.id: t.density for t in profile.tensors if t.density is not None} == {"t0": 1.0, "t1": 0.5}
    assert profile.source["density"] == {"file": str(good)}
    for content, tail in (({"t9": 0.5}, "t9: profile 'trace' has no tensor with this id or name"),
                          ({"t1": 2}, "t1: expected a density (fraction of non-zero elements) from 0 to 1, got 2")):
        bad = _write(tmp_path, content, "bad.json")
        result = run("import", "kineto", str(trace), "--density-file", str(bad), "-o", str(tmp_path / "b.json"))
        assert result.exit_code == 2
        assert result.output.strip().splitlines()[-1] == f"error: {bad}: {tail}"
        assert not (tmp_path / "b.json").exists()
    # without a file, an imported profile has no densities
    result = run("import", "kineto", str(trace), "-o", str(out))
    assert result.exit_code == 0 and all(t.density is None for t in load_profile(out).tensors)


@needs_torch
def test_a_transformer_at_a_shorter_sequence_and_the_cuda_only_kernels():
    pytest.importorskip("transformers", reason="the tiny GPT-2 needs transformers")
    from tracer.pytorch.trace import trace
    tiny = "tests.test_trace:tiny_gpt2"
    profile = trace(tiny, batch=4, seq=32, density=True, density_batch=2, density_seq=16)
    note = profile.source["density"]
    assert (note["batch"], note["seq"]) == (2, 16) and "unmeasured" in note
    by_name = {t.name: t for t in profile.tensors}
    assert by_name["transformer.wpe.weight.grad"].density is None   # half its rows unused at seq 16
    masks = [t for t in profile.tensors if t.dtype == "bool" and "native_dropout" in t.name]
    assert masks and all(0.8 < t.density < 1.0 for t in masks)        # GPT-2's dropout keeps 90%
    with pytest.raises(InputError, match="_scaled_dot_product_flash_attention.* have no CPU kernel"):
        trace(tiny, batch=2, amp="bf16", density=True)   # CUDA's flash attention: no CPU kernel
    with pytest.raises(InputError, match="traced without a seq"):
        trace(tiny, batch=2, density=True, density_seq=16)
