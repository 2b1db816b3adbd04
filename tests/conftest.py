"""Shared helpers: tiny hand-written profiles whose numbers can be checked by hand."""
from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest

from simulator.profile import FORMAT, profile_from_dict

# The data the tests read lives in the repository (tests/data, each source with its licence).
DATA = Path(__file__).resolve().parent / "data"
TOYS = DATA / "toys"
VGG13 = DATA / "triosim-vgg13-h100"     # sarchlab/triosim (MIT): a measured VGG13 step, gzipped
VGG13_TRACE = VGG13 / "kineto_trace.json.gz"
VGG13_ET = VGG13 / "execution_trace.json.gz"


def read_json(path):
    """A JSON file's data, gunzipped if its name ends in ``.gz``."""
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if str(path).endswith(".gz") else data)


def gunzip_to(folder, *paths):
    """Each ``NAME.gz`` of ``paths`` written into ``folder`` as ``NAME``; the new paths."""
    out = []
    for path in paths:
        target = Path(folder) / Path(path).name[: -len(".gz")]
        target.write_bytes(gzip.decompress(Path(path).read_bytes()))
        out.append(target)
    return out


def profile_dict(tensors, ops, name="tiny"):
    """Build profile JSON data from compact specs.

    tensors: {id: (bytes, kind)}
    ops: [(id, phase, time_us, inputs, outputs, updates, workspace_bytes)], trailing
    fields optional.
    """
    out_ops = []
    for spec in ops:
        spec = list(spec) + [None] * (7 - len(spec))
        op_id, phase, time_us, inputs, outputs, updates, workspace = spec
        op = {"id": op_id, "name": f"k_{op_id}", "phase": phase or "forward",
              "time_us": 1.0 if time_us is None else time_us,
              "inputs": list(inputs or []), "outputs": list(outputs or [])}
        if updates:
            op["updates"] = list(updates)
        if workspace:
            op["workspace_bytes"] = workspace
        out_ops.append(op)
    return {"format": FORMAT, "name": name, "source": {"kind": "synthetic"},
            "tensors": [{"id": t, "bytes": b, "kind": k} for t, (b, k) in tensors.items()],
            "ops": out_ops}


def make_profile(tensors, ops, name="tiny"):
    return profile_from_dict(profile_dict(tensors, ops, name))


# A two-layer training step: forward, backward, SGD-like updates.
#   w1, w2: 100 B weights; x: 10 B input.
#   f1: x,w1 -> a1 (40)   f2: a1,w2 -> a2 (30)   loss: a2 -> l (1)
#   b2: l,a1,w2 -> g2 (100), da1 (40)   b1: da1,x -> g1 (100)
#   u2: g2 updates w2      u1: g1 updates w1
TWO_LAYER_TENSORS = {
    "w1": (100, "weight"), "w2": (100, "weight"), "x": (10, "input"),
    "a1": (40, "activation"), "a2": (30, "activation"), "l": (1, "activation"),
    "g2": (100, "gradient"), "da1": (40, "gradient"), "g1": (100, "gradient"),
}
TWO_LAYER_OPS = [
    ("f1", "forward", 10.0, ["x", "w1"], ["a1"]),
    ("f2", "forward", 20.0, ["a1", "w2"], ["a2"], None, 8),
    ("loss", "forward", 1.0, ["a2"], ["l"]),
    ("b2", "backward", 30.0, ["l", "a1", "w2"], ["g2", "da1"]),
    ("b1", "backward", 15.0, ["da1", "x"], ["g1"]),
    ("u2", "optimizer", 2.0, ["g2"], [], ["w2"]),
    ("u1", "optimizer", 2.0, ["g1"], [], ["w1"]),
]


@pytest.fixture
def two_layer_dict():
    return copy.deepcopy(profile_dict(TWO_LAYER_TENSORS, TWO_LAYER_OPS, "two-layer"))


@pytest.fixture
def two_layer(two_layer_dict):
    return profile_from_dict(two_layer_dict)


def run_cli_in(folder, *args):
    """``swapplan ARGS`` through click's runner with ``folder`` as the working directory
    (relative outputs land there); the result, with stdout and stderr apart."""
    import os

    from click.testing import CliRunner

    from cli import app
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        return CliRunner().invoke(app, [str(a) for a in args], obj={"debug": False})
    finally:
        os.chdir(cwd)
