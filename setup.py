"""Builds the optional C fast path of the simulator (simulator/_fastsim.c).

Everything else is declared in pyproject.toml. The extension is optional: without a
C compiler the install still succeeds and the simulator uses its pure-Python path.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("simulator._fastsim", sources=["simulator/_fastsim.c"], optional=True,
                             extra_compile_args=["-O2"])])
