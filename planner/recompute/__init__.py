"""Recompute planners: tensors dropped after their forward use and recomputed before
backward needs them (activation checkpointing and its optimal / budgeted forms)."""
