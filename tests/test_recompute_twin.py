"""R15 has one Python statement (simulator/model/recompute.py) and one C twin, swapadvisor's
decoder (planner/search/swapadvisor/_fastdecode.c ``recomputable_flags``): the two agree on
every tensor of every shipped profile, and the position form the bound reads
(``recomputable_until``) says what ``recompute_problem`` says."""
from __future__ import annotations

import pytest

from planner.swap_recompute.swapadvisor import decode
from simulator.catalog import open_profile, shipped_profile_paths
from simulator.hardware import load_hardware
from simulator.model.recompute import recompute_problem, recomputable_until
from tests.conftest import make_profile

PROFILES = [open_profile(path) for path in shipped_profile_paths()]


@pytest.mark.skipif(not decode.available(), reason="the C decoder is not built: no C compiler at install time")
@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_the_c_decoder_recomputes_what_the_python_predicate_allows(profile):
    problem = decode.Problem(profile, load_hardware("a100-40gb-pcie4"), profile.peak_bytes // 2)
    python = bytes(recompute_problem(profile, t.id) is None for t in profile.tensors)
    assert decode._fastdecode.recomputable(problem.arrays) == python
    assert 0 < sum(python) < len(python)     # both answers occur


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_recomputable_until_is_where_the_predicate_starts_to_refuse(profile):
    n = len(profile.ops)
    for tensor in profile.tensors:
        until, made_by = recomputable_until(profile, tensor.id), profile.producer[tensor.id]
        if made_by is None:
            assert until == -1 and recompute_problem(profile, tensor.id, 0) is not None
            continue
        for before in {made_by + 1, until, until + 1, n}:
            if made_by < before <= n:
                assert (recompute_problem(profile, tensor.id, before) is None) == (before <= until)


def test_the_reasons_name_the_rule_broken():
    tensors = {"w": (8, "weight"), "x": (8, "activation"), "y": (8, "activation"), "z": (8, "activation")}
    ops = [("f1", "forward", 1.0, ["w"], ["x"]), ("f2", "forward", 1.0, ["x"], ["y"], ["w"]),
           ("f3", "forward", 1.0, ["x"], ["z"]), ("b1", "backward", 1.0, ["y", "z"], [], ["x"])]
    profile = make_profile(tensors, ops, "r15")
    assert recompute_problem(profile, "w") == "recompute of persistent tensor 'w' (weight)"
    assert recompute_problem(profile, "y") == "recompute of 'y': its producer 'f2' updates 'w' in place"
    assert recompute_problem(profile, "x") == ("recompute of 'x': it was updated in place after it was produced "
                                               "(by op 'b1')")
    assert recompute_problem(profile, "x", before=1) is None            # before any update
    assert recompute_problem(profile, "x", before=2) == ("recompute of 'x': its producer 'f1' reads 'w', updated "
                                                         "in place since by op 'f2' (a re-run would read the new "
                                                         "value)")
    assert recompute_problem(profile, "x", before=3) == recompute_problem(profile, "x", before=2)
    assert recomputable_until(profile, "x") == 1                       # f2 updates w, which f1 read
    assert recompute_problem(profile, "x", updates=()) is None          # a walk that saw none
    assert "by op 'b1'" in recompute_problem(profile, "x", updates=(("x", "b1"),))
    assert recompute_problem(profile, "z") is None
