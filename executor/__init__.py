"""Replays a plan for real: one scheduler, a host emulation backend and a CUDA backend.

``executor.api.replay(profile, plan, hardware, ...)`` runs one iteration of a plan as a
runtime would, from the plan alone (executor/program.py reads it), on real buffers with
real copies and real concurrency (executor/scheduler.py decides what starts when;
executor/host.py and executor/cuda.py do it), checks every tensor's bytes at every use
and after every copy (executor/pattern.py), and reports what it measured beside the
simulator's prediction. See docs/executor.md.
"""
