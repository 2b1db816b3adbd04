"""Builders of hostile inputs shared by the tests and benchmarks/fuzz_cli.py."""
from __future__ import annotations


def two_layer_plan() -> dict:
    """A plan document for the two-layer profile of tests/conftest.py using every action
    kind and an initial placement: the seed that fuzzers mutate."""
    return {"format": "swapplan-plan/1", "profile": {"name": "two-layer"}, "hardware": "a100-40gb-pcie4",
            "budget_bytes": 400, "initial": {"w1": "host"},
            "actions": [{"kind": "offload", "tensor": "a1", "to": "host", "after": "f2"},
                        {"kind": "prefetch", "tensor": "a1", "from": "host", "after": "loss", "before": "b2"},
                        {"kind": "drop", "tensor": "a2", "after": "loss"},
                        {"kind": "recompute", "tensor": "a2", "before": "b2"},
                        {"kind": "prefetch", "tensor": "w1", "from": "host", "after": None, "before": "f1"},
                        {"kind": "offload", "tensor": "w1", "to": "host", "after": "u1"}]}


def alias_bomb(levels: int) -> str:
    """A YAML profile whose aliases expand to 10^levels nodes."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]")
    return ("format: swapplan-profile/1\nname: bomb\nsource:\n" + "\n".join("  " + line for line in lines)
            + "\ntensors: []\nops: []\n")


def node_paths(tree) -> list[list]:
    """The path (keys and indices) of every node of a parsed document, the root first."""
    paths: list[list] = []

    def walk(node, path):
        paths.append(path)
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, path + [key])
        elif isinstance(node, list):
            for k, value in enumerate(node):
                walk(value, path + [k])

    walk(tree, [])
    return paths
