"""Profile: one training iteration as ops and tensors, in execution order.

Format ``swapplan-profile/1`` (JSON, gzipped JSON or YAML). Loading validates
everything and derives, once, the facts every planner and the simulator need:
producer, consumers, updaters, first and last use, the no-swap peak and the
ideal time. See docs/formats.md.

This package's public interface is the names below; its modules: records.py (the
format's constants and entries: Tensor, Op, Variant, Split, Collective, TensorNode, OpNode),
facts.py (Profile and what is derived on construction, the canonical text),
order.py (op orders and the dataflow graph), parse.py (reading a document, field by
field), file.py (load and save).
"""
from .facts import Profile, canonical_json, profile_sha256
from .file import load_profile, profile_bytes, save_profile
from .order import dataflow_graph, order_violation, schedule_problem, update_order_pairs
from .parse import profile_from_dict
from .records import (COLLECTIVE_KINDS, FORMAT, FX_REWRITES, INPUT_ROLES, PERSISTENT_KINDS, PHASES, SOURCE_KINDS, SPLIT_AXES,
                      TENSOR_KINDS, Collective, Op, OpNode, Split, Tensor, TensorNode, Variant)

__all__ = ["COLLECTIVE_KINDS", "Collective", "FORMAT", "FX_REWRITES", "INPUT_ROLES", "PERSISTENT_KINDS", "PHASES", "SOURCE_KINDS", "SPLIT_AXES",
           "TENSOR_KINDS", "Op", "OpNode", "Profile", "Split", "Tensor", "TensorNode", "Variant", "canonical_json",
           "dataflow_graph", "load_profile", "order_violation", "profile_bytes", "profile_from_dict",
           "profile_sha256", "save_profile", "schedule_problem", "update_order_pairs"]
