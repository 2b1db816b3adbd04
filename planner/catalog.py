"""Imports every planner module so that each registers itself (see registry.py)."""
from . import none  # noqa: F401
