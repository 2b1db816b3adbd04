"""Tiny machines and graphs with round numbers, for hand-computed simulation tests.

The test machine moves 1 byte per microsecond over PCIe (0.001 GB/s) each way and
0.5 bytes per microsecond to and from its SSD, with no latency unless asked.
"""
from __future__ import annotations

from simulator.api import Simulator
from simulator.fast import explicit as fastpath
from simulator.hardware import hardware_from_dict
from simulator.plan import Plan, check_plan
from tests.conftest import make_profile


def machine(duplex="full", pcie_latency=0, ssd_latency=0, ssd_path="host", host="1GiB", ssd="1GiB",
            h2d=0.001, d2h=0.001, ssd_read=0.0005, ssd_write=0.0005, cpu=None):
    data = {
        "name": "test-machine",
        "gpu": {"memory": "1GiB", "fp32_tflops": 1, "fp16_tflops": 1, "hbm_gbps": 1},
        "pcie": {"h2d_gbps": h2d, "d2h_gbps": d2h, "duplex": duplex, "latency_us": pcie_latency},
        "host": {"memory": host},
        "ssd": {"read_gbps": ssd_read, "write_gbps": ssd_write, "latency_us": ssd_latency,
                "capacity": ssd, "path": ssd_path},
    }
    if cpu is not None:
        data["cpu"] = cpu
    return hardware_from_dict(data)


def plan(profile, *actions, **kw) -> Plan:
    return Plan(profile.name, tuple(actions), **kw)


# The chain: f1 -> a(100) -> f2 -> b(50) -> f3 -> c(50) -> f4 -> d(10) -> b1(d, a) -> e(10) -> b2
# Every op takes 10 us. No-swap memory by op: f1 100, f2 150, f3 200, f4 160, b1 120, b2 10.
# a is idle from f2 (position 1) to b1 (position 4).
CHAIN_TENSORS = {"a": (100, "activation"), "b": (50, "activation"), "c": (50, "activation"),
                 "d": (10, "activation"), "e": (10, "gradient")}
CHAIN_OPS = [
    ("f1", "forward", 10.0, [], ["a"]),
    ("f2", "forward", 10.0, ["a"], ["b"]),
    ("f3", "forward", 10.0, ["b"], ["c"]),
    ("f4", "forward", 10.0, ["c"], ["d"]),
    ("b1", "backward", 10.0, ["d", "a"], ["e"]),
    ("b2", "backward", 10.0, ["e"], []),
]


def chain():
    return make_profile(CHAIN_TENSORS, CHAIN_OPS, "chain")


def both_paths(profile, plan, hardware, budget_bytes=None, record=False):
    """Simulate with the Python reference and, when it is built, the C path alone, and
    check that they agree: the same Result for a valid plan (feasible or not), the same
    rule, op and tensor for an invalid one. Returns the reference Result."""
    sim = Simulator(profile, hardware)
    reference = sim.simulate(plan, budget_bytes, record=record, reference=True)
    if fastpath.available() and not plan.reference_only:   # C models no codecs, placements, variants, groups
        check_plan(plan, profile, sim.machine.has_ssd)
        budget = sim.budget(plan, budget_bytes)
        out = fastpath._run(sim.compiled, sim.machine, fastpath.pack_plan(sim.compiled, plan), budget)
        assert out[0] != fastpath.OVERFLOW or reference.iteration_us * 1e6 >= 2**63
        if reference.valid:
            fast = fastpath.simulate(sim.compiled, sim.machine, plan, budget)
            assert fast is not None or out[0] == fastpath.OVERFLOW
            if fast is not None:
                assert fast.to_dict() == reference.to_dict()
        else:
            assert out[0] == fastpath.INVALID
            ops, tensors = sim.compiled.op_ids, sim.compiled.tensor_ids
            got = (f"R{out[1]}", ops[out[2]] if out[2] >= 0 else None, tensors[out[3]] if out[3] >= 0 else None)
            assert got == (reference.rule, reference.op, reference.tensor), reference.reason
        score = sim.score(plan, budget_bytes)
        assert (score.valid, score.feasible, score.rule) == (reference.valid, reference.feasible, reference.rule)
    return reference
