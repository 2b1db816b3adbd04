"""One family map (issue 50): the folder a planner's module is in is the family `swapplan
planners` lists it under. Every planner names its family when it registers (one of
planner/core/families.py ``FAMILIES``) and its module lives in that family's folder
(``FOLDERS``); a family folder holds planners of that family and their helpers (``_``
modules) only, and the flags that say what a plan may hold agree with the family."""
from __future__ import annotations

import pkgutil
from pathlib import Path

import planner
from planner.core.families import FAMILIES, FAMILY_NAMES, FOLDERS
from planner.core.registry import get_planner, planners

ROOT = Path(planner.__file__).resolve().parent


def test_every_planner_lives_in_the_folder_of_the_family_it_registers():
    for spec in planners():
        package, folder, *_ = spec.func.__module__.split(".")
        assert package == "planner" and folder == FOLDERS[spec.family], (spec.name, spec.family, spec.func.__module__)


def test_every_family_has_one_folder_and_every_folder_outside_core_and_shared_is_a_family():
    assert list(FOLDERS) == list(FAMILIES) and len(set(FOLDERS.values())) == len(FOLDERS)
    assert set(FAMILY_NAMES.values()) == set(FAMILIES)
    packages = {m.name for m in pkgutil.iter_modules([str(ROOT)]) if m.ispkg}
    assert packages == set(FOLDERS.values()) | {"core", "shared"}
    assert {spec.family for spec in planners()} == set(FAMILIES)   # no empty family


def test_a_family_folder_holds_planners_and_their_helpers_only():
    """Each module or sub-package of a family folder whose name does not start with ``_``
    registers at least one planner (the catalog imports them as planners)."""
    modules = {spec.func.__module__ for spec in planners()}
    for family, folder in FOLDERS.items():
        for member in pkgutil.iter_modules([str(ROOT / folder)]):
            if member.name.startswith("_"):
                continue
            name = f"planner.{folder}.{member.name}"
            assert any(m == name or m.startswith(name + ".") for m in modules), f"{name} registers no planner"


def test_the_flags_agree_with_the_family():
    for spec in planners():
        assert (spec.memory == "uvm") == (spec.family == "unified memory"), spec.name
        assert bool(spec.cpu_phases) == (spec.family == "CPU offload"), spec.name
        if spec.family in ("recompute", "swap + recompute"):
            assert spec.recomputes, spec.name
        if spec.family in ("baseline", "swap", "placement"):
            assert not spec.recomputes, spec.name   # g10 recomputes only with its ``recompute_param``


def test_the_planners_the_old_folders_misplaced_are_in_their_familys_folder():
    where = {name: get_planner(name).func.__module__ for name in
             ("none", "capuchin", "superneurons", "swapadvisor", "joint", "best", "autotm", "tmof", "deeptm", "vdnn++")}
    assert where == {
        "none": "planner.baseline.none", "capuchin": "planner.swap_recompute.capuchin",
        "superneurons": "planner.swap_recompute.superneurons", "swapadvisor": "planner.swap_recompute.swapadvisor.search",
        "joint": "planner.swap_recompute.joint", "best": "planner.swap_recompute.best",
        "autotm": "planner.swap.autotm", "tmof": "planner.swap.tmof", "deeptm": "planner.swap.deeptm",
        "vdnn++": "planner.placement.vdnn_plus"}
