"""Imports every planner module of this package so that each registers itself (see
registry.py). A new planner is a new module here; nothing else needs to change."""
from __future__ import annotations

import importlib
import pkgutil

_NOT_PLANNERS = {"api", "analysis", "bound", "catalog", "compression", "estimate", "grouping", "placement", "lowering", "registry"}

import planner as _package

for _module in sorted(m.name for m in pkgutil.iter_modules(_package.__path__)):
    if _module not in _NOT_PLANNERS and not _module.startswith("_"):
        importlib.import_module(f"planner.{_module}")
