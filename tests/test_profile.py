"""The profile format: derived facts checked by hand, round-trips, every validation error."""
from __future__ import annotations

import copy
import gzip
import json

import pytest

from simulator.errors import InputError
from simulator.profile import (
    canonical_json, dataflow_graph, load_profile, order_violation, profile_from_dict,
    profile_sha256, save_profile,
)
from tests.conftest import make_profile


# ----------------------------------------------------------------------------- derived facts


def test_two_layer_peak_by_hand(two_layer):
    # persistent: w1 100 + w2 100 + x 10 = 210, resident at every op.
    # f1:   a1 40                                   -> 250
    # f2:   a1 40 + a2 30 + workspace 8             -> 288
    # loss: a1 40 + a2 30 + l 1                     -> 281
    # b2:   a1 40 + l 1 + g2 100 + da1 40           -> 391  (last use of a1 and l)
    # b1:   g2 100 (alive until u2) + da1 40 + g1 100 -> 450  <- peak
    # u2:   g2 100 + g1 100                         -> 410
    # u1:   g1 100                                  -> 310
    assert two_layer.persistent_bytes == 210
    assert two_layer.resident_bytes == (250, 288, 281, 391, 450, 410, 310)
    assert two_layer.peak_bytes == 450
    assert two_layer.peak_op == "b1"


def test_two_layer_lifetimes(two_layer):
    idx = two_layer.op_index
    assert two_layer.producer["a1"] == idx["f1"]
    assert two_layer.producer["w1"] is None
    assert two_layer.consumers["a1"] == (idx["f2"], idx["b2"])
    assert two_layer.updaters["w2"] == (idx["u2"],)
    assert two_layer.first_use["w2"] == idx["f2"]
    assert two_layer.last_use["w2"] == idx["u2"]  # updates count as uses
    assert two_layer.lifetime("a1") == (0, 3)
    assert two_layer.lifetime("w1") == (0, 6)


def test_ideal_time_is_sum_of_op_times(two_layer):
    assert two_layer.ideal_us == 10 + 20 + 1 + 30 + 15 + 2 + 2


def test_workspace_counts_only_during_its_op():
    # a (50) lives f..g; the workspace of g (1000) adds only at g.
    p = make_profile({"a": (50, "activation"), "b": (5, "activation")},
                     [("f", "forward", 1, [], ["a"]), ("g", "forward", 1, ["a"], ["b"], None, 1000),
                      ("h", "forward", 1, ["b"], [])])
    assert p.resident_bytes == (50, 1055, 5)
    assert (p.peak_bytes, p.peak_op) == (1055, "g")


def test_unused_output_lives_only_during_its_producer():
    p = make_profile({"a": (70, "activation"), "b": (1, "activation")},
                     [("f", "forward", 1, [], ["a"]), ("g", "forward", 1, [], ["b"])])
    assert p.resident_bytes == (70, 1)
    assert p.last_use["a"] is None


def test_empty_profile_peak_is_persistent_bytes():
    p = make_profile({"w": (64, "weight")}, [])
    assert (p.peak_bytes, p.peak_op, p.ideal_us) == (64, None, 0.0)


def test_dataflow_graph_edges(two_layer):
    g = dataflow_graph(two_layer)
    assert set(g.nodes) == {"f1", "f2", "loss", "b2", "b1", "u2", "u1"}
    assert g["f1"]["b2"]["tensors"] == ["a1"]
    # in-place update ordering: readers of w2 (f2, b2) come before its updater u2
    assert g.has_edge("f2", "u2") and g.has_edge("b2", "u2")
    import networkx as nx
    assert nx.is_directed_acyclic_graph(g)


def test_order_violation_accepts_profile_order_and_valid_reorder(two_layer):
    order = [op.id for op in two_layer.ops]
    assert order_violation(two_layer, order) is None
    swapped = ["f1", "f2", "loss", "b2", "u2", "b1", "u1"]  # u2 only needs g2
    assert order_violation(two_layer, swapped) is None


def test_order_violation_names_dependency(two_layer):
    op, tensor, problem = order_violation(two_layer, ["f2", "f1", "loss", "b2", "b1", "u2", "u1"])
    assert (op, tensor) == ("f2", "a1")


def test_order_violation_keeps_in_place_update_order():
    # u updates w in place between reader r1 and reader r2: neither may cross it.
    p = make_profile({"w": (8, "weight"), "a": (1, "activation"), "b": (1, "activation")},
                     [("r1", "forward", 1, ["w"], ["a"]), ("u", "optimizer", 1, [], [], ["w"]),
                      ("r2", "forward", 1, ["w"], ["b"])])
    assert order_violation(p, ["r1", "u", "r2"]) is None
    op, tensor, problem = order_violation(p, ["r1", "r2", "u"])
    assert (op, tensor) == ("u", "w") and "R21" in problem
    assert order_violation(p, ["u", "r1", "r2"])[1] == "w"


def test_order_violation_missing_and_duplicate(two_layer):
    assert "missing" in order_violation(two_layer, ["f1"])[2]
    assert "twice" in order_violation(two_layer, ["f1", "f1"])[2]
    assert "unknown" in order_violation(two_layer, ["zz"])[2]


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("suffix", [".json", ".json.gz", ".yaml"])
def test_round_trip_every_format(two_layer, tmp_path, suffix):
    path = tmp_path / f"p{suffix}"
    save_profile(two_layer, path)
    again = load_profile(path)
    assert again == two_layer
    assert profile_sha256(again) == profile_sha256(two_layer)
    assert again.peak_bytes == two_layer.peak_bytes


def test_gzip_save_is_reproducible(two_layer, tmp_path):
    save_profile(two_layer, tmp_path / "a.json.gz")
    save_profile(two_layer, tmp_path / "b.json.gz")
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()
    assert json.loads(gzip.decompress((tmp_path / "a.json.gz").read_bytes()))["name"] == "two-layer"


def test_sha_ignores_key_order_and_int_float(two_layer_dict):
    a = profile_from_dict(two_layer_dict)
    shuffled = copy.deepcopy(two_layer_dict)
    shuffled["ops"] = [dict(reversed(list(op.items()))) for op in shuffled["ops"]]
    shuffled["ops"][0]["time_us"] = int(shuffled["ops"][0]["time_us"])
    assert profile_sha256(profile_from_dict(shuffled)) == profile_sha256(a)


def test_sha_changes_with_content(two_layer_dict):
    a = profile_sha256(profile_from_dict(two_layer_dict))
    two_layer_dict["tensors"][3]["bytes"] += 1
    assert profile_sha256(profile_from_dict(two_layer_dict)) != a


def test_canonical_json_is_compact_and_sorted(two_layer):
    text = canonical_json(two_layer)
    assert ", " not in text and ": " not in text
    assert text.startswith('{"format":"swapplan-profile/1"')


def test_save_is_atomic_on_missing_folder(two_layer, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        save_profile(two_layer, tmp_path / "nope" / "p.json")
    assert not (tmp_path / "nope").exists()


# ----------------------------------------------------------------------------- errors


def _error(data, file="t.json") -> str:
    with pytest.raises(InputError) as info:
        profile_from_dict(data, file)
    return str(info.value)


def test_error_wrong_format(two_layer_dict):
    two_layer_dict["format"] = "swapplan-profile/9"
    assert _error(two_layer_dict) == "t.json: format: expected 'swapplan-profile/1', got 'swapplan-profile/9'"


def test_error_top_level_not_object():
    assert _error([1, 2]) == "t.json: top level: expected an object, got a list"


def test_error_unknown_top_field(two_layer_dict):
    two_layer_dict["opz"] = []
    assert "t.json: opz: unknown field" in _error(two_layer_dict)


def test_error_missing_field(two_layer_dict):
    del two_layer_dict["ops"][1]["time_us"]
    assert _error(two_layer_dict) == "t.json: ops[1] (f2).time_us: missing required field"


def test_error_duplicate_tensor_id(two_layer_dict):
    two_layer_dict["tensors"].append({"id": "a1", "bytes": 1, "kind": "activation"})
    assert _error(two_layer_dict) == "t.json: tensors[9].id: duplicate tensor id 'a1'"


def test_error_duplicate_op_id(two_layer_dict):
    two_layer_dict["ops"][2]["id"] = "f1"
    assert _error(two_layer_dict) == "t.json: ops[2].id: duplicate op id 'f1'"


def test_error_unknown_tensor(two_layer_dict):
    two_layer_dict["ops"][1]["inputs"][0] = "ghost"
    assert _error(two_layer_dict) == "t.json: ops[1] (f2).inputs[0]: unknown tensor 'ghost'"


def test_error_produced_twice(two_layer_dict):
    two_layer_dict["ops"][1]["outputs"] = ["a2", "a1"]
    assert _error(two_layer_dict) == "t.json: ops[1] (f2).outputs[1]: tensor 'a1' is produced twice (already by op 'f1')"


def test_error_used_before_produced(two_layer_dict):
    two_layer_dict["ops"][0], two_layer_dict["ops"][1] = two_layer_dict["ops"][1], two_layer_dict["ops"][0]
    assert _error(two_layer_dict) == ("t.json: ops[0] (f2).inputs[0]: uses tensor 'a1' before op 'f1' "
                                      "produces it (ops must be in topological order)")


def test_error_self_cycle(two_layer_dict):
    two_layer_dict["ops"][0]["inputs"].append("a1")
    assert "uses tensor 'a1' that it produces itself (a cycle)" in _error(two_layer_dict)


def test_error_never_produced_but_used(two_layer_dict):
    two_layer_dict["tensors"].append({"id": "z", "bytes": 1, "kind": "activation"})
    two_layer_dict["ops"][0]["inputs"].append("z")
    assert "uses tensor 'z', which no op produces" in _error(two_layer_dict)


def test_error_non_persistent_never_produced(two_layer_dict):
    two_layer_dict["tensors"].append({"id": "z", "bytes": 1, "kind": "gradient"})
    assert _error(two_layer_dict) == "t.json: tensors[9] (z): non-persistent tensor (gradient) is never produced by any op"


@pytest.mark.parametrize("value, problem", [
    (-5, "must be >= 0, got -5"),
    (1.5, "expected a whole number, got 1.5"),
    ("12", 'expected a whole number, got "12"'),
    (True, "expected a whole number, got true"),
    (None, "expected a whole number, got null"),
])
def test_error_bad_tensor_bytes(two_layer_dict, value, problem):
    two_layer_dict["tensors"][0]["bytes"] = value
    assert _error(two_layer_dict) == f"t.json: tensors[0] (w1).bytes: {problem}"


@pytest.mark.parametrize("value, problem", [
    (-1.0, "must be >= 0, got -1.0"),
    ("fast", 'expected a number, got "fast"'),
    (float("inf"), "expected a finite number, got inf"),
    (float("nan"), "expected a finite number, got nan"),
])
def test_error_bad_op_time(two_layer_dict, value, problem):
    two_layer_dict["ops"][0]["time_us"] = value
    assert _error(two_layer_dict) == f"t.json: ops[0] (f1).time_us: {problem}"


def test_error_negative_workspace(two_layer_dict):
    two_layer_dict["ops"][0]["workspace_bytes"] = -1
    assert _error(two_layer_dict) == "t.json: ops[0] (f1).workspace_bytes: must be >= 0, got -1"


def test_error_negative_flops(two_layer_dict):
    two_layer_dict["ops"][0]["flops"] = -3
    assert "ops[0] (f1).flops: must be >= 0" in _error(two_layer_dict)


def test_error_bad_kind(two_layer_dict):
    two_layer_dict["tensors"][0]["kind"] = "parameter"
    assert _error(two_layer_dict) == ("t.json: tensors[0] (w1).kind: 'parameter' is not one of weight, "
                                      "activation, gradient, optimizer_state, input, other")


def test_error_bad_phase(two_layer_dict):
    two_layer_dict["ops"][0]["phase"] = "fwd"
    assert "t.json: ops[0] (f1).phase: 'fwd' is not one of forward, backward, optimizer, other" == _error(two_layer_dict)


def test_error_output_and_update_of_one_op(two_layer_dict):
    two_layer_dict["ops"][0]["updates"] = ["a1"]
    assert _error(two_layer_dict) == "t.json: ops[0] (f1).updates: tensor 'a1' is in both outputs and updates of one op"


def test_error_persistent_output(two_layer_dict):
    two_layer_dict["ops"][5]["outputs"] = ["w2"]
    two_layer_dict["ops"][5]["updates"] = []
    assert "ops[5] (u2).outputs[0]: tensor 'w2' is persistent (weight) and cannot be an op output" in _error(two_layer_dict)


def test_error_inputs_not_a_list(two_layer_dict):
    two_layer_dict["ops"][0]["inputs"] = "x"
    assert _error(two_layer_dict) == 't.json: ops[0] (f1).inputs: expected a list of ids, got "x"'


def test_error_id_not_a_string(two_layer_dict):
    two_layer_dict["ops"][0]["inputs"] = [3]
    assert _error(two_layer_dict) == "t.json: ops[0] (f1).inputs[0]: expected a non-empty string id, got 3"


def test_error_unknown_op_field(two_layer_dict):
    two_layer_dict["ops"][0]["time"] = 3
    assert "t.json: ops[0] (f1).time: unknown field" in _error(two_layer_dict)


def test_error_bad_source(two_layer_dict):
    two_layer_dict["source"] = "traced"
    assert _error(two_layer_dict) == "t.json: source: expected an object"


def test_error_file_level(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "swapplan-profile/1",\n "name": }')
    with pytest.raises(InputError, match=r"bad.json: line 2 column 10: invalid JSON"):
        load_profile(bad)
    with pytest.raises(InputError, match="no such file"):
        load_profile(tmp_path / "missing.json")
    (tmp_path / "x.json.gz").write_bytes(b"not gzip")
    with pytest.raises(InputError, match="x.json.gz: cannot read"):
        load_profile(tmp_path / "x.json.gz")
    (tmp_path / "y.yaml").write_text("a: [1, 2\n")
    with pytest.raises(InputError, match=r"y.yaml: line \d+: invalid YAML"):
        load_profile(tmp_path / "y.yaml")
    (tmp_path / "n.json").write_text('{"format": NaN}')
    with pytest.raises(InputError, match="invalid JSON"):
        load_profile(tmp_path / "n.json")


# ----------------------------------------------------------------------------- rerun_outputs (R15)


def _multi_output_dict() -> dict:
    t = {"x": (8, "input"), "y": (4, "activation"), "m": (1, "activation"), "s": (2, "activation")}
    ops = [("f", "forward", 1.0, ["x"], ["y", "m", "s"]), ("g", "backward", 1.0, ["y", "m", "s"], [])]
    return profile_from_dict(make_profile(t, ops, "multi").to_dict()).to_dict()


def test_rerun_outputs_default_is_every_output():
    p = profile_from_dict(_multi_output_dict())
    assert p.ops[0].rerun_outputs is None and p.ops[0].remade() == ("y", "m", "s")
    assert [p.rerun_extra_bytes(t) for t in ("y", "m", "s", "x")] == [3, 6, 5, 0]


def test_rerun_outputs_narrows_what_a_rerun_makes_and_round_trips():
    data = _multi_output_dict()
    data["ops"][0]["rerun_outputs"] = ["y", "m"]
    p = profile_from_dict(data)
    assert p.rerun_extra_bytes("y") == 1 and p.rerun_extra_bytes("m") == 4
    assert p.rerun_extra_bytes("s") == 5          # s is made, and the re-run makes y and m beside it
    again = profile_from_dict(json.loads(canonical_json(p)))
    assert again.ops[0].rerun_outputs == ("y", "m") and again.sha256 == p.sha256
    assert again.sha256 != profile_from_dict(_multi_output_dict()).sha256


@pytest.mark.parametrize("value,problem", [
    (["x"], "ops[0] (f).rerun_outputs[0]: 'x' is not an output of the op"),
    (["y", "y"], "ops[0] (f).rerun_outputs[1]: 'y' is listed twice"),
    ("y", "ops[0] (f).rerun_outputs"),
])
def test_rerun_outputs_errors_name_the_field(value, problem):
    data = _multi_output_dict()
    data["ops"][0]["rerun_outputs"] = value
    assert problem in _error(data)
