"""swapplan shard (issue 51): the profile of one data-parallel rank, per strategy, on a
hand-built model whose every figure is worked out below, and GPT-2 zero3 over 8 ranks."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import app
from shard import shard_profile
from simulator import catalog
from simulator.errors import InputError
from simulator.profile import FORMAT, load_profile, profile_from_dict, save_profile

# Three blocks of two forward and two backward ops each, a loss in the root module, one
# optimizer op per weight (AdamW-like: one state tensor). fp32 weights of 10, 16 and 7
# elements: over 4 ranks they pad to 12, 16 and 8 elements (shards of 3, 4 and 2).
W = {"w0": 40, "w1": 64, "w2": 28}


def model(extra_tensors=(), extra_ops=None, name="toy"):
    tensors = [{"id": "x0", "bytes": 400, "kind": "input"}]
    for k in range(3):
        tensors += [{"id": f"w{k}", "bytes": W[f"w{k}"], "kind": "weight", "name": f"blocks.{k}.lin.weight",
                     "dtype": "fp32"},
                    {"id": f"m{k}", "bytes": W[f"w{k}"], "kind": "optimizer_state", "dtype": "fp32"},
                    {"id": f"h{k}", "bytes": 100, "kind": "activation"},
                    {"id": f"x{k + 1}", "bytes": 100, "kind": "activation"},
                    {"id": f"dh{k}", "bytes": 100, "kind": "gradient"},
                    {"id": f"dx{k}", "bytes": 100, "kind": "gradient"},
                    {"id": f"g{k}", "bytes": W[f"w{k}"], "kind": "gradient", "dtype": "fp32"}]
    tensors += [{"id": "l", "bytes": 4, "kind": "activation"}, {"id": "dx3", "bytes": 100, "kind": "gradient"},
                *extra_tensors]

    def op(oid, phase, inputs, outputs, module, updates=(), time_us=10.0):
        data = {"id": oid, "name": f"k_{oid}", "phase": phase, "time_us": time_us, "inputs": list(inputs),
                "outputs": list(outputs), "module": module}
        if updates:
            data["updates"] = list(updates)
        return data

    ops = []
    for k in range(3):
        ops += [op(f"f{k}.a", "forward", [f"x{k}", f"w{k}"], [f"h{k}"], f"blocks.{k}.lin"),
                op(f"f{k}.b", "forward", [f"h{k}"], [f"x{k + 1}"], f"blocks.{k}.act")]
    ops += [op("loss", "forward", ["x3"], ["l"], "loss"), op("lossb", "backward", ["l"], ["dx3"], "loss")]
    for k in (2, 1, 0):
        ops += [op(f"b{k}.a", "backward", [f"dx{k + 1}", f"h{k}"], [f"dh{k}"], f"blocks.{k}.act"),
                op(f"b{k}.b", "backward", [f"dh{k}", f"x{k}", f"w{k}"], [f"dx{k}", f"g{k}"], f"blocks.{k}.lin")]
    ops += [op(f"opt{k}", "optimizer", [f"g{k}"], [], f"blocks.{k}.lin", updates=[f"w{k}", f"m{k}"], time_us=8.0)
            for k in range(3)]
    if extra_ops:
        ops = extra_ops(ops, op)
    return profile_from_dict({"format": FORMAT, "name": name, "source": {"kind": "synthetic"},
                              "tensors": tensors, "ops": ops})


@pytest.fixture(scope="module")
def toy():
    return model()


def ids(profile):
    return [op.id for op in profile.ops]


def collective(profile, op_id):
    op = profile.ops[profile.op_index[op_id]]
    assert op.collective is not None and op.time_us == 0
    return op


def sizes(profile, *tids):
    return [profile.tensor_by_id[t].bytes for t in tids]


# ----------------------------------------------------------------------------- zero3


def test_zero3_shards_with_padding_and_gathers_one_unit_ahead(toy):
    rank = shard_profile(toy, "zero3", 4)
    assert ids(rank) == [
        "ag.fwd.blocks.0", "ag.fwd.blocks.1", "f0.a", "f0.b", "ag.fwd.blocks.2", "f1.a", "f1.b", "f2.a", "f2.b",
        "loss", "lossb", "ag.bwd.blocks.2", "ag.bwd.blocks.1", "b2.a", "b2.b", "rs.blocks.2", "ag.bwd.blocks.0",
        "b1.a", "b1.b", "rs.blocks.1", "b0.a", "b0.b", "rs.blocks.0", "opt0", "opt1", "opt2"]
    # shards: padded elements / 4 ranks (12, 16, 8 elements -> 3, 4, 2), weights and state alike
    assert sizes(rank, "w0", "w1", "w2", "m0", "m1", "m2") == [12, 16, 8, 12, 16, 8]
    assert rank.tensor_by_id["w0"].shape == (3,) and rank.tensor_by_id["w0"].kind == "weight"
    assert rank.persistent_bytes == 400 + 36 + 36
    # the gathers: the unit's shards in, a full (padded) copy of each out; reduce-scatters the reverse
    for k, padded in enumerate((48, 64, 32)):
        for tag, phase in (("fwd", "forward"), ("bwd", "backward")):
            ag = collective(rank, f"ag.{tag}.blocks.{k}")
            assert (ag.collective.kind, ag.collective.world, ag.collective.bytes) == ("all_gather", 4, padded)
            assert ag.phase == phase and ag.module == f"blocks.{k}"
            assert ag.inputs == (f"w{k}",) and ag.outputs == (f"w{k}@gathered.{tag}",)
            assert rank.tensor_by_id[f"w{k}@gathered.{tag}"].bytes == padded
            assert rank.tensor_by_id[f"w{k}@gathered.{tag}"].kind == "other"
        rs = collective(rank, f"rs.blocks.{k}")
        assert (rs.collective.kind, rs.collective.bytes, rs.phase) == ("reduce_scatter", padded, "backward")
        assert rs.inputs == (f"g{k}",) and rs.outputs == (f"g{k}@shard",)
        assert rank.tensor_by_id[f"g{k}@shard"].bytes == padded // 4
    # the forward reads the forward copies, the backward the backward's, the step the shards
    op = {o.id: o for o in rank.ops}
    assert op["f1.a"].inputs == ("x1", "w1@gathered.fwd") and op["b1.b"].inputs == ("dh1", "x1", "w1@gathered.bwd")
    assert op["opt1"].inputs == ("g1@shard",) and op["opt1"].updates == ("w1", "m1")
    # the step on a quarter (padding included): 8 us x (shard bytes / full bytes) of g, w, m
    assert op["opt0"].time_us == pytest.approx(8.0 * 36 / 120)
    assert op["opt1"].time_us == pytest.approx(2.0)
    assert op["opt2"].time_us == pytest.approx(8.0 * 24 / 84)
    shard = rank.source["shard"]
    assert shard == {"strategy": "zero3", "world": 4, "units": ["blocks.0", "blocks.1", "blocks.2"],
                     "padding_bytes": 3 * 12, "bucket_bytes": None, "keep_gathered": False,
                     "keep_root_gathered": False, "prefetch": True}
    assert rank.name == "toy-zero3-w4"


def test_zero3_without_prefetch_gathers_just_before_each_unit(toy):
    rank = shard_profile(toy, "zero3", 4, prefetch=False)
    assert ids(rank) == [
        "ag.fwd.blocks.0", "f0.a", "f0.b", "ag.fwd.blocks.1", "f1.a", "f1.b", "ag.fwd.blocks.2", "f2.a", "f2.b",
        "loss", "lossb", "ag.bwd.blocks.2", "b2.a", "b2.b", "rs.blocks.2", "ag.bwd.blocks.1", "b1.a", "b1.b",
        "rs.blocks.1", "ag.bwd.blocks.0", "b0.a", "b0.b", "rs.blocks.0", "opt0", "opt1", "opt2"]
    assert rank.source["shard"]["prefetch"] is False


def test_zero3_keep_gathered_gathers_once_and_the_backward_reads_the_forwards_copies(toy):
    rank = shard_profile(toy, "zero3", 4, keep_gathered=True)
    assert not any(o.startswith("ag.bwd") for o in ids(rank))
    assert [o for o in ids(rank) if o.startswith(("ag.", "rs."))] == [
        "ag.fwd.blocks.0", "ag.fwd.blocks.1", "ag.fwd.blocks.2", "rs.blocks.2", "rs.blocks.1", "rs.blocks.0"]
    b1 = rank.ops[rank.op_index["b1.b"]]
    assert "w1@gathered.fwd" in b1.inputs
    # the copies live from their gather to the backward: more memory held than with resharding
    assert rank.lifetime("w1@gathered.fwd")[1] == rank.op_index["b1.b"]
    assert rank.peak_bytes >= shard_profile(toy, "zero3", 4).peak_bytes


def test_zero3_keep_root_gathered_keeps_only_the_root_unit(toy):
    def tied(ops, op):      # a weight read by block 0 and by the loss: the root unit's
        ops[0]["inputs"].append("wt")
        ops[6]["inputs"].append("wt")                         # loss
        ops[7]["outputs"].append("gt")                        # lossb makes its gradient
        ops[-4]["updates"] = ["gt"]                           # b0.b accumulates into it
        ops.append(op("optt", "optimizer", ["gt"], [], "loss", updates=["wt", "mt"], time_us=4.0))
        return ops
    extra = [{"id": "wt", "bytes": 80, "kind": "weight"}, {"id": "mt", "bytes": 80, "kind": "optimizer_state"},
             {"id": "gt", "bytes": 80, "kind": "gradient"}]
    profile = model(extra, tied)
    rank = shard_profile(profile, "zero3", 4)
    assert rank.source["shard"]["units"] == ["root", "blocks.0", "blocks.1", "blocks.2"]
    order = ids(rank)
    assert order[:3] == ["ag.fwd.root", "ag.fwd.blocks.0", "ag.fwd.blocks.1"]
    # the root's backward starts at the loss's backward (block 2's gather prefetched with it); its
    # gradient is ready once block 0 has added to it
    assert order[order.index("lossb") - 2: order.index("lossb")] == ["ag.bwd.root", "ag.bwd.blocks.2"]
    assert order.index("rs.root") == order.index("rs.blocks.0") + 1
    assert collective(rank, "rs.root").inputs == ("gt",)
    kept = shard_profile(profile, "zero3", 4, keep_root_gathered=True)
    assert "ag.bwd.root" not in ids(kept) and "ag.bwd.blocks.0" in ids(kept)
    assert kept.source["shard"]["keep_root_gathered"] is True


def test_wrap_patterns_name_the_units(toy):
    two = shard_profile(toy, "zero3", 4, wrap=["blocks.0", "blocks.1"])
    assert two.source["shard"]["units"] == ["blocks.0", "blocks.1", "root"]
    assert collective(two, "ag.fwd.root").inputs == ("w2",)
    assert shard_profile(toy, "zero3", 4, wrap=["blocks.*"]).source["shard"]["units"] == \
        ["blocks.0", "blocks.1", "blocks.2"]
    inner = shard_profile(toy, "zero3", 4, wrap=["**.lin"])         # the innermost unit holds the op
    assert inner.source["shard"]["units"] == ["blocks.0.lin", "blocks.1.lin", "blocks.2.lin"]
    assert collective(inner, "ag.fwd.blocks.1.lin").inputs == ("w1",)
    whole = shard_profile(toy, "zero3", 4, wrap=["*"])             # one segment: blocks, loss
    assert whole.source["shard"]["units"] == ["blocks"]
    with pytest.raises(InputError) as err:
        shard_profile(toy, "zero3", 4, wrap=["blocks.*", "encoder.*"])
    assert err.value.where == "wrap[1]" and "matches no op" in err.value.problem


def test_default_units_are_the_outermost_numbered_blocks():
    from shard.roles import find_roles
    from shard.units import find_units

    def deeper(ops, op):   # numbered modules inside a block (a downsample's 0 and 1) stay in it
        for o in ops:
            if o["id"] in ("f1.a", "b1.b"):
                o["module"] = "blocks.1.down.0"
            if o["id"] in ("f1.b", "b1.a"):
                o["module"] = "blocks.1.down.1"
        return ops
    profile = model(extra_ops=deeper)
    assert find_units(profile, find_roles(profile), None).paths == ("blocks.0", "blocks.1", "blocks.2")

    def stems(ops, op):    # no purely numbered children: stem + number (layer0, layer1, ...)
        for o in ops:
            o["module"] = o["module"].replace("blocks.", "layer")
        return ops
    profile = model(extra_ops=stems)
    assert find_units(profile, find_roles(profile), None).paths == ("layer0", "layer1", "layer2")


# ----------------------------------------------------------------------------- zero1, zero2, ddp


def test_zero2_reduce_scatters_buckets_as_gradients_are_ready_and_gathers_after_the_step(toy):
    rank = shard_profile(toy, "zero2", 4, bucket_bytes=64)
    assert ids(rank) == [
        "f0.a", "f0.b", "f1.a", "f1.b", "f2.a", "f2.b", "loss", "lossb", "b2.a", "b2.b", "b1.a", "b1.b",
        "rs.bucket0", "b0.a", "b0.b", "rs.bucket1", "opt0", "opt1", "ag.step.bucket0", "opt2", "ag.step.bucket1"]
    rs0, rs1 = collective(rank, "rs.bucket0"), collective(rank, "rs.bucket1")
    assert (rs0.collective.kind, rs0.collective.bytes, rs0.inputs) == ("reduce_scatter", 32 + 64, ("g2", "g1"))
    assert rs0.outputs == ("g2@shard", "g1@shard") and (rs1.collective.bytes, rs1.inputs) == (48, ("g0",))
    ag0, ag1 = collective(rank, "ag.step.bucket0"), collective(rank, "ag.step.bucket1")
    assert (ag0.collective.kind, ag0.collective.bytes, ag0.updates, ag0.inputs, ag0.outputs) == \
        ("all_gather", 48 + 64, ("w0", "w1"), (), ())
    assert ag0.phase == "optimizer" and (ag1.collective.bytes, ag1.updates) == (32, ("w2",))
    assert sizes(rank, "w0", "w1", "w2", "m0", "m1", "m2") == [40, 64, 28, 12, 16, 8]   # weights whole
    assert rank.persistent_bytes == 400 + 132 + 36
    # the full gradient dies at its reduce-scatter; the step reads the shard
    assert rank.lifetime("g2")[1] == rank.op_index["rs.bucket0"]
    assert rank.ops[rank.op_index["opt2"]].inputs == ("g2@shard",)
    assert rank.ops[rank.op_index["opt1"]].time_us == pytest.approx(2.0)
    assert rank.source["shard"]["bucket_bytes"] == 64 and rank.source["shard"]["units"] is None
    assert rank.source["shard"]["padding_bytes"] == 3 * 12       # state, gradients, parameters


def test_zero1_keeps_the_full_gradients_until_the_backward_ends(toy):
    rank = shard_profile(toy, "zero1", 4, bucket_bytes=64)
    order = ids(rank)
    assert order[order.index("b0.b") + 1: order.index("opt0")] == ["rs.bucket0", "rs.bucket1"]
    assert rank.lifetime("g2")[1] == rank.op_index["rs.bucket0"] > rank.op_index["b0.b"]
    assert rank.peak_bytes >= shard_profile(toy, "zero2", 4, bucket_bytes=64).peak_bytes
    assert [o for o in order if o.startswith("ag.")] == ["ag.step.bucket0", "ag.step.bucket1"]


def test_ddp_all_reduces_buckets_in_place_after_the_op_that_completes_each(toy):
    rank = shard_profile(toy, "ddp", 4, bucket_bytes=64)
    order = ids(rank)
    assert order.index("ar.bucket0") == order.index("b1.b") + 1
    assert order.index("ar.bucket1") == order.index("b0.b") + 1
    ar0 = collective(rank, "ar.bucket0")
    assert (ar0.collective.kind, ar0.collective.bytes, ar0.updates, ar0.outputs) == \
        ("all_reduce", 28 + 64, ("g2", "g1"), ())
    assert ar0.collective.wire_bytes() == 2 * (92 * 3 // 4)
    assert rank.persistent_bytes == toy.persistent_bytes
    assert [o for o in order if not o.startswith("ar.")] == ids(toy)
    one = shard_profile(toy, "ddp", 4)      # 25 MiB: one bucket, after the last gradient
    assert [o for o in ids(one) if o.startswith("ar.")] == ["ar.bucket0"]


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3"])
def test_world_one_is_the_profile_itself(toy, strategy):
    rank = shard_profile(toy, strategy, 1)
    assert rank.tensors == toy.tensors and rank.ops == toy.ops
    assert (rank.peak_bytes, rank.ideal_us) == (toy.peak_bytes, toy.ideal_us)
    assert rank.source["shard"]["world"] == 1 and rank.source["shard"]["padding_bytes"] == 0


def test_a_rank_saves_and_loads_back(toy, tmp_path):
    for strategy in ("ddp", "zero1", "zero2", "zero3"):
        rank = shard_profile(toy, strategy, 4, bucket_bytes=64)
        save_profile(rank, tmp_path / f"{strategy}.json")
        back = load_profile(tmp_path / f"{strategy}.json")
        assert back.sha256 == rank.sha256 and back.ops == rank.ops


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, where", [
    ({"strategy": "zero4"}, "strategy"),
    ({"world": 0}, "world"),
    ({"world": True}, "world"),
    ({"world": 65537}, "world"),
    ({"bucket_bytes": 0}, "bucket_bytes"),
    ({"strategy": "ddp", "keep_gathered": True}, "keep_gathered"),
    ({"strategy": "zero2", "wrap": ["blocks.*"]}, "wrap"),
    ({"strategy": "zero1", "prefetch": False}, "prefetch"),
    ({"wrap": ["nothing.*"]}, "wrap[0]"),
    ({"wrap": [""]}, "wrap[0]"),
])
def test_bad_arguments_name_the_argument(toy, kwargs, where):
    args = {"strategy": "zero3", "world": 4, **kwargs}
    with pytest.raises(InputError) as err:
        shard_profile(toy, **args)
    assert err.value.where == where


def test_bad_profiles_name_the_field(toy):
    no_weights = profile_from_dict({"format": FORMAT, "name": "nw", "tensors": [
        {"id": "a", "bytes": 4, "kind": "activation"}], "ops": [
        {"id": "o", "name": "k", "phase": "forward", "time_us": 1, "inputs": [], "outputs": ["a"]}]})
    with pytest.raises(InputError) as err:
        shard_profile(no_weights, "ddp", 2)
    assert err.value.where == "tensors"
    no_step = model(extra_ops=lambda ops, op: [o for o in ops if o["phase"] != "optimizer"])
    with pytest.raises(InputError) as err:
        shard_profile(no_step, "zero3", 2)
    assert err.value.where == "ops" and "no optimizer op updates a weight" in err.value.problem
    rank = shard_profile(toy, "zero3", 2)
    with pytest.raises(InputError) as err:
        shard_profile(rank, "zero3", 2)
    assert err.value.where == "source.shard"
    unmarked = profile_from_dict({**rank.to_dict(), "source": {}})
    with pytest.raises(InputError) as err:
        shard_profile(unmarked, "ddp", 2)
    assert err.value.where == "ops[0] (ag.fwd.blocks.0).collective"


# ----------------------------------------------------------------------------- the command


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args], obj={"debug": False})


def test_the_command_writes_a_rank_and_info_shows_it(toy, tmp_path):
    save_profile(toy, tmp_path / "toy.json")
    result = run("shard", tmp_path / "toy.json", "--strategy", "zero3", "--world", "4", "-o", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert "units        3: blocks.0, blocks.1, blocks.2" in result.output
    assert "all_gather 6 (288 B" in result.output and "reduce_scatter 3 (144 B" in result.output
    info = json.loads(run("info", tmp_path / "r.json", "--json").output)
    assert info["shard"]["strategy"] == "zero3" and info["collective_ops"] == 9
    assert info["persistent_bytes"] == 472 and info["bytes_by_kind"]["weight"] == 36
    text = run("info", tmp_path / "r.json").output
    assert "shard        zero3 over 4 ranks; 9 collective ops (all_gather 6, reduce_scatter 3)" in text
    result = run("shard", tmp_path / "toy.json", "--strategy", "ddp", "--world", "4", "--bucket", "64B",
                 "-o", tmp_path / "d.json")
    assert result.exit_code == 0 and "all_reduce 2 (132 B" in result.output


@pytest.mark.parametrize("args, says", [
    (["--strategy", "zero3", "--world", "0"], "world"),
    (["--strategy", "zero3", "--world", "4", "--wrap", "nothing"], "wrap[0]"),
    (["--strategy", "ddp", "--world", "4", "--keep-gathered"], "keep_gathered"),
    (["--strategy", "ddp", "--world", "4", "--bucket", "lots"], "--bucket"),
    (["--strategy", "zero5", "--world", "4"], "--strategy"),
])
def test_the_command_refuses_bad_input_with_one_line_and_status_2(toy, tmp_path, args, says):
    save_profile(toy, tmp_path / "toy.json")
    result = run("shard", tmp_path / "toy.json", *args, "-o", tmp_path / "r.json")
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0]
    assert "Traceback" not in result.output and not (tmp_path / "r.json").exists()


# ----------------------------------------------------------------------------- GPT-2 over 8 ranks


@pytest.fixture(scope="module")
def gpt2():
    return catalog.open_profile("gpt2-b48-s1024")


def test_gpt2_zero3_over_8(gpt2):
    rank = shard_profile(gpt2, "zero3", 8)
    assert 0.12 <= rank.persistent_bytes / gpt2.persistent_bytes <= 0.135
    weights = sum(t.bytes for t in gpt2.tensors if t.kind == "weight")
    wire = sum(op.collective.wire_bytes() for op in rank.ops if op.collective is not None)
    assert wire == pytest.approx(3 * weights * 7 / 8, rel=0.05)
    units = rank.source["shard"]["units"]
    assert units == ["root"] + [f"transformer.h.{k}" for k in range(12)]
    # the tied embedding (read by wte and lm_head) is the root's; its gradient is reduced last
    assert collective(rank, "ag.fwd.root").inputs[0] == "t0"
    assert rank.ops[-149].id == "rs.root" and rank.ops[-148].phase == "optimizer"
    assert rank.peak_bytes < gpt2.peak_bytes and rank.ideal_us < gpt2.ideal_us


def test_gpt2_world_one_keeps_peak_and_time(gpt2):
    for strategy in ("ddp", "zero3"):
        rank = shard_profile(gpt2, strategy, 1)
        assert (rank.peak_bytes, rank.ideal_us) == (gpt2.peak_bytes, gpt2.ideal_us)


# ----------------------------------------------------------------------------- trace --shard


def tiny_sequential():
    """nn.Sequential of two Linear layers: modules 0, 1, 2 (torch imported by the caller's test)."""
    import torch
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    return net, torch.randn(16, 32)


def test_trace_shard_writes_the_rank_of_the_traced_step(tmp_path):
    pytest.importorskip("torch", reason="tracing needs torch (the 'trace' extra)")
    out = tmp_path / "r.json"
    result = run("trace", f"{__name__}:tiny_sequential", "--shard", "zero3", "--world", "2", "-o", out)
    assert result.exit_code == 0, result.output
    rank = load_profile(out)
    assert rank.source["shard"]["units"] == ["0", "2"] and rank.source["kind"] == "traced"
    assert rank.name.endswith("-zero3-w2") and "units        2: 0, 2" in result.output
    for args in (["--shard", "zero3"], ["--world", "2"]):
        result = run("trace", f"{__name__}:tiny_sequential", *args, "-o", tmp_path / "x.json")
        assert result.exit_code == 2 and "--shard and --world go together" in result.stderr
