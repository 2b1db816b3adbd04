"""Swap planners: tensors copied to host memory or SSD and brought back before they are
needed (explicit mode: the plan's copies are the only ones)."""
