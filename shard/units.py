"""Wrap units: the groups of parameters gathered together (FSDP's wrapped modules,
ZeRO-3's modules), found from the ops' ``module`` paths.

By default the units are the model's repeated blocks: the numbered children
(``transformer.h.3``, ``model.layers.3``, ``0``) of every module that has at least two
numbered children holding parameters, outermost first (a numbered child inside a unit,
such as ResNet's ``layer1.0.downsample.0``, stays in its unit). When no module has
purely numbered children, children named stem + number (``layer3``, ``stage2``) are
taken the same way. ``wrap`` patterns name the units instead: a module path is a unit
when it matches a pattern segment by segment (``*`` within one dotted segment, as in
fnmatch; ``**`` any number of segments), and an op belongs to the innermost unit
containing its module, as a parameter belongs to the innermost FSDP module. Everything
else is the root unit.

A parameter belongs to the unit of the ops that read it outside the step; one read from
several units (tied embeddings) goes to the root unit; one no such op reads, to the unit
its name lies in.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

from simulator.errors import InputError
from simulator.profile import Profile

from .roles import OPTIMIZER, Roles

ROOT = ""          # the root unit's path: the whole model
ROOT_NAME = "root"  # how ids and summaries name it
_STEM = re.compile(r"^(.*?)(\d+)$")


@dataclass(frozen=True)
class Units:
    of_op: tuple[str, ...]        # per op: its unit's path (ROOT for the root unit; ops of the step too)
    of_param: dict[str, str]      # parameter -> its unit's path
    paths: tuple[str, ...]        # the units that hold parameters, in the order the forward reaches them

    def params_of(self, path: str, params: tuple[str, ...]) -> list[str]:
        return [p for p in params if self.of_param[p] == path]


def unit_name(path: str) -> str:
    return path if path != ROOT else ROOT_NAME


def find_units(profile: Profile, roles: Roles, wrap: tuple[str, ...] | None) -> Units:
    """The units (``wrap`` patterns, or the repeated blocks), each op's and each
    parameter's. InputError (field ``wrap[i]``) for a pattern that matches no op's module."""
    ops = profile.ops
    paths = sorted({op.module for op in ops if op.module})
    if wrap is not None:
        wrapped = _wrapped_by_patterns(profile, wrap, paths)
    else:
        wrapped = _repeated_blocks(profile, roles).__contains__
    cache: dict[str | None, str] = {}

    def unit_of(path: str | None) -> str:
        if path not in cache:
            cache[path] = _innermost(path, wrapped)
        return cache[path]

    of_op = tuple(unit_of(op.module) for op in ops)
    of_param = {}
    for p in roles.params:
        units = {of_op[i] for i in roles.readers(profile, p)}
        if len(units) == 1:
            of_param[p] = units.pop()
        elif units:
            of_param[p] = ROOT
        else:
            name = profile.tensor_by_id[p].name
            of_param[p] = unit_of(name.rsplit(".", 1)[0]) if name and "." in name else ROOT
    first: dict[str, int] = {}
    for p in roles.params:
        readers = roles.readers(profile, p)
        at = readers[0] if readers else len(ops)
        unit = of_param[p]
        first[unit] = min(first.get(unit, at), at)
    for i, unit in enumerate(of_op):
        if unit in first and roles.passes[i] != OPTIMIZER:
            first[unit] = min(first[unit], i)
    order = sorted(first, key=lambda u: (first[u], u))
    return Units(of_op=of_op, of_param=of_param, paths=tuple(order))


def _innermost(path: str | None, wrapped) -> str:
    """The longest prefix of ``path`` (whole segments, itself included) that is a unit."""
    if not path:
        return ROOT
    segments = path.split(".")
    for k in range(len(segments), 0, -1):
        prefix = ".".join(segments[:k])
        if wrapped(prefix):
            return prefix
    return ROOT


def _wrapped_by_patterns(profile: Profile, wrap: tuple[str, ...], paths: list[str]):
    patterns = []
    for k, pattern in enumerate(wrap):
        if not isinstance(pattern, str) or not pattern.strip():
            raise InputError("<argument>", f"wrap[{k}]", f"expected a module path pattern, got {pattern!r}")
        patterns.append(pattern.strip().split("."))
    prefixes = {".".join(p.split(".")[:k]) for p in paths for k in range(1, p.count(".") + 2)}
    for k, segments in enumerate(patterns):
        if not any(_match(segments, prefix.split(".")) for prefix in prefixes):
            raise InputError(profile.origin, f"wrap[{k}]",
                             f"pattern {wrap[k]!r} matches no op's module (modules such as "
                             f"{', '.join(repr(p) for p in paths[:3]) or 'none: the ops name no module'})")
    memo: dict[str, bool] = {}

    def wrapped(prefix: str) -> bool:
        if prefix not in memo:
            memo[prefix] = any(_match(segments, prefix.split(".")) for segments in patterns)
        return memo[prefix]
    return wrapped


def _match(pattern: list[str], path: list[str]) -> bool:
    """fnmatch segment by segment; ``**`` matches any number of segments."""
    if not pattern:
        return not path
    head = pattern[0]
    if head == "**":
        return any(_match(pattern[1:], path[k:]) for k in range(len(path) + 1))
    return bool(path) and fnmatchcase(path[0], head) and _match(pattern[1:], path[1:])


def _repeated_blocks(profile: Profile, roles: Roles) -> set[str]:
    """The default units: the numbered children (holding parameters) of the outermost
    modules with at least two of them; stem + number children when there are none."""
    holding = set()
    for p in roles.params:
        for i in roles.readers(profile, p):
            if profile.ops[i].module:
                holding.add(profile.ops[i].module)
    for numbered in (_pure_number, _stem_number):
        children: dict[tuple[str, str], set[str]] = {}
        for path in holding:
            segments = path.split(".")
            for k, segment in enumerate(segments):
                key = numbered(segment)
                if key is not None:
                    parent = ".".join(segments[:k])
                    children.setdefault((parent, key), set()).add(".".join(segments[:k + 1]))
        candidates = sorted(((parent, stem), kids) for (parent, stem), kids in children.items() if len(kids) >= 2)
        units: set[str] = set()
        for (parent, _), kids in sorted(candidates, key=lambda c: (c[0][0].count(".") if c[0][0] else -1, c[0])):
            if parent and _innermost(parent, units.__contains__) != ROOT:
                continue   # inside a unit already taken: the outermost blocks win
            units |= kids
        if units:
            return units
    return set()


def _pure_number(segment: str) -> str | None:
    return "" if segment.isdigit() else None


def _stem_number(segment: str) -> str | None:
    found = _STEM.match(segment)
    return found[1] if found and found[1] and not found[1][-1].isdigit() else None
