"""Which traced ops may run in chunks (R54), by kind: the rule a profile's ``split`` states.

A cross-entropy (log-softmax, NLL loss and their gradients) and a softmax or layer norm
work row by row; a matmul and a convolution, and their gradients, work sample by sample
over the batch (a weight's gradient then sums over the chunks); elementwise ops work
element by element; a sum over the rows (a bias's gradient) adds each chunk into its
output, which R54 keeps whole (it slices only what is cut along the split). Left whole:
batch norm (its statistics span the batch), dropout (its random draws follow the op's
order) and embeddings.
"""
from __future__ import annotations

from dataclasses import replace

from simulator.profile import Profile, Split

AXIS_BY_OP = {
    **dict.fromkeys(("aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::nll_loss_forward",
                     "aten::nll_loss_backward", "aten::_softmax", "aten::_softmax_backward_data",
                     "aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::sum"), "rows"),
    **dict.fromkeys(("aten::mm", "aten::addmm", "aten::bmm", "aten::convolution", "aten::convolution_backward",
                     "aten::max_pool2d_with_indices", "aten::max_pool2d_with_indices_backward"), "batch"),
    **dict.fromkeys(("aten::relu", "aten::relu_", "aten::threshold_backward", "aten::gelu", "aten::gelu_backward", "aten::add",
                     "aten::mul", "aten::tanh", "aten::tanh_backward"), "elements"),
}


def split_rule(op_name: str) -> Split | None:
    """The ``split`` a traced op of this ATen name carries, or None (it runs whole)."""
    axis = AXIS_BY_OP.get(op_name)
    return None if axis is None else Split(axis)


def mark_splittable(profile: Profile) -> Profile:
    """``profile`` with every op the rule knows marked (ops marked already keep theirs)."""
    ops = tuple(op if op.split is not None or split_rule(op.name) is None else replace(op, split=split_rule(op.name))
                for op in profile.ops)
    return Profile(name=profile.name, tensors=profile.tensors, ops=ops, source=profile.source, origin=profile.origin)
