"""Fuzzing the three loaders: a corrupted valid file gives a valid object or an
InputError, never any other exception."""
from __future__ import annotations

import json
import os
import tempfile

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.errors import InputError
from simulator.hardware import load_hardware, preset_dir
from simulator.plan import check_plan, load_plan
from simulator.profile import load_profile, profile_bytes
from tests.conftest import TWO_LAYER_OPS, TWO_LAYER_TENSORS, make_profile
from tests.hostile import node_paths, two_layer_plan

PROFILE = make_profile(TWO_LAYER_TENSORS, TWO_LAYER_OPS, "two-layer")
PROFILE_TEXT = profile_bytes(PROFILE)
HARDWARE_TEXT = (preset_dir() / "a100-40gb-pcie4.yaml").read_bytes()
PLAN_TEXT = json.dumps(two_layer_plan()).encode()

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=False), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=6)


def _byte_mutation(data: bytes, draw) -> bytes:
    """Flip, delete or insert a few bytes."""
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        how = draw(st.sampled_from(["flip", "delete", "insert", "truncate"]))
        if how == "flip":
            data[at] = draw(st.integers(0, 255))
        elif how == "delete":
            del data[at]
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        else:
            del data[at:]
    return bytes(data)


def _tree_mutation(tree, draw):
    """Replace, delete or retype one node of the parsed document."""
    paths = node_paths(tree)
    path = draw(st.sampled_from(paths[1:] or paths))
    if not path:
        return draw(json_values)
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    how = draw(st.sampled_from(["replace", "delete", "duplicate"]))
    if how == "replace":
        parent[path[-1]] = draw(json_values)
    elif how == "delete":
        del parent[path[-1]]
    elif isinstance(parent, list):
        parent.append(parent[path[-1]])
    else:
        parent[path[-1]] = [parent[path[-1]]]
    return tree


def _with_file(data: bytes, suffix: str, use):
    """Write ``data`` to a temporary file, call ``use(path)``, remove the file."""
    handle, path = tempfile.mkstemp(suffix=suffix)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        return use(path)
    finally:
        os.unlink(path)


def _load_ok_or_input_error(loader, data: bytes, suffix: str) -> None:
    try:
        _with_file(data, suffix, loader)
    except InputError as exc:
        assert str(exc) and "\n" not in exc.problem


def _load_plan_and_check(path):
    check_plan(load_plan(path), PROFILE)


@FUZZ
@given(st.data())
def test_profile_loader_byte_corruption(data):
    _load_ok_or_input_error(load_profile, _byte_mutation(PROFILE_TEXT, data.draw), ".json")


@FUZZ
@given(st.data())
def test_profile_loader_tree_corruption(data):
    tree = _tree_mutation(json.loads(PROFILE_TEXT), data.draw)
    _load_ok_or_input_error(load_profile, json.dumps(tree).encode(), ".json")
    _load_ok_or_input_error(load_profile, yaml.safe_dump(tree).encode(), ".yaml")


@FUZZ
@given(st.data())
def test_profile_loader_yaml_byte_corruption(data):
    text = yaml.safe_dump(json.loads(PROFILE_TEXT)).encode()
    _load_ok_or_input_error(load_profile, _byte_mutation(text, data.draw), ".yaml")


@FUZZ
@given(st.data())
def test_hardware_loader_byte_corruption(data):
    _load_ok_or_input_error(load_hardware, _byte_mutation(HARDWARE_TEXT, data.draw), ".yaml")


@FUZZ
@given(st.data())
def test_hardware_loader_tree_corruption(data):
    tree = _tree_mutation(yaml.safe_load(HARDWARE_TEXT), data.draw)
    _load_ok_or_input_error(load_hardware, yaml.safe_dump(tree).encode(), ".yaml")


@FUZZ
@given(st.data())
def test_plan_loader_byte_corruption(data):
    _load_ok_or_input_error(_load_plan_and_check, _byte_mutation(PLAN_TEXT, data.draw), ".json")


@FUZZ
@given(st.data())
def test_plan_loader_tree_corruption(data):
    tree = _tree_mutation(json.loads(PLAN_TEXT), data.draw)
    _load_ok_or_input_error(_load_plan_and_check, json.dumps(tree).encode(), ".json")


def test_fuzz_inputs_start_valid():
    """The seeds are valid, so corruption is what the fuzzers exercise."""
    assert _with_file(PROFILE_TEXT, ".json", load_profile).peak_bytes == PROFILE.peak_bytes
    assert _with_file(HARDWARE_TEXT, ".yaml", load_hardware).name == "a100-40gb-pcie4"
    _with_file(PLAN_TEXT, ".json", _load_plan_and_check)
