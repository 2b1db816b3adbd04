"""Builds the optional C fast paths: the simulator's (simulator/fast/_fastsim.c), UVM mode's
(simulator/fast/_fastuvm.c) and the swapadvisor decoder's (planner/swap_recompute/swapadvisor/_fastdecode.c).

Everything else is declared in pyproject.toml. The extensions are optional: without a
C compiler the install still succeeds and the pure-Python paths are used.
"""
from setuptools import Extension, setup

ARENA = dict(include_dirs=["simulator/fast"], depends=["simulator/fast/_arena.h"])   # the allocator they share

setup(ext_modules=[
    Extension("simulator.fast._fastsim", sources=["simulator/fast/_fastsim.c"], optional=True,
              extra_compile_args=["-O2"], **ARENA),
    Extension("simulator.fast._fastuvm", sources=["simulator/fast/_fastuvm.c"], optional=True,
              extra_compile_args=["-O2"], **ARENA),
    Extension("planner.swap_recompute.swapadvisor._fastdecode",
              sources=["planner/swap_recompute/swapadvisor/_fastdecode.c"], optional=True,
              extra_compile_args=["-O2"], **ARENA),
])
