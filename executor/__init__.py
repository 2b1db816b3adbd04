"""Replays a plan for real: a host emulation backend and a CUDA backend."""
