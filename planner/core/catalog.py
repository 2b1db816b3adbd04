"""Imports every planner so that each registers itself (see registry.py): the folder of
each family (``families.FOLDERS``, in the order `swapplan planners` lists them) and, in
each, every module and sub-package whose name does not start with ``_``.

A new planner is a new module in its family's folder (a new family, a new folder and its
line in families.py); a helper that is not a planner starts with ``_`` (one family's) or
lives in ``planner/shared`` (several families'). Nothing else needs to change."""
from __future__ import annotations

import importlib
import pkgutil

from .families import FOLDERS

for _folder in FOLDERS.values():   # by name, as every planner: no import circle
    _members = importlib.import_module(f"planner.{_folder}")
    for _module in sorted(m.name for m in pkgutil.iter_modules(_members.__path__)):
        if not _module.startswith("_"):
            importlib.import_module(f"planner.{_folder}.{_module}")
