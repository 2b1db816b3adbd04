"""Imports every planner so that each registers itself (see registry.py): the ``none``
baseline here in core, then every family package of ``planner`` (each sub-package but
core) and, in each, every module and sub-package whose name does not start with ``_``.

A new planner is a new module in its family's package (a new family, a new package); a
helper that is not a planner starts with ``_`` or lives in core. Nothing else needs to
change."""
from __future__ import annotations

import importlib
import pkgutil

import planner as _package

importlib.import_module("planner.core.none")   # the baseline (by name, as every planner: no import circle)
for _family in sorted(m.name for m in pkgutil.iter_modules(_package.__path__) if m.ispkg and m.name != "core"):
    _members = importlib.import_module(f"planner.{_family}")
    for _module in sorted(m.name for m in pkgutil.iter_modules(_members.__path__)):
        if not _module.startswith("_"):
            importlib.import_module(f"planner.{_family}.{_module}")
