"""Plan: the exported artifact, ``swapplan-plan/1``: what leaves GPU memory and when.

Every plan read is validated against ``plans/schema.json``, then checked
structurally against its profile with ``check_plan`` (input errors). Whether it keeps
the simulation rules (R11-R21) is decided by the simulator's compile and is a result. See docs/formats.md.
"""
from __future__ import annotations

import importlib.resources
import json
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import jsonschema

from .errors import InputError
from .fields import is_id_list
from .files import read_document, write_atomic
from .model.splits import split_profile
from .profile import Profile, profile_sha256, schedule_problem
from .units import MAX_BYTES, MAX_COUNT

FORMAT = "swapplan-plan/1"
ACTION_KINDS = ("offload", "prefetch", "drop", "recompute", "load", "store", "encode", "decode")
CODEC_KINDS = ("encode", "decode")   # on-GPU encodings (R42)
MEMORY_MODES = ("explicit", "uvm")   # explicit copies (R1-R28), or CUDA managed memory (R30-R37)
HOST_KINDS = ("load", "store")   # SSD <-> host memory, for ops on the CPU (R26)
TIERS = ("host", "ssd")


@dataclass(frozen=True, slots=True)
class Action:
    """One plan step. ``after`` / ``before`` are op ids (None: iteration start / end).

    offload: tensor, to, after; prefetch: tensor, source ("from" in JSON), after,
    before; drop: tensor, after; recompute: tensor, before; load (SSD -> host memory)
    and store (host memory -> SSD): tensor, after; encode: tensor, after, codec; decode:
    tensor, before, codec (R42). ``codec`` on an offload or prefetch compresses it (R41);
    ``group`` makes it one transfer with the others of that group (R53).
    """
    kind: str
    tensor: str
    to: str | None = None
    source: str | None = None
    after: str | None = None
    before: str | None = None
    codec: str | None = None
    group: str | None = None

    def to_dict(self) -> dict:
        if self.kind in ("offload", "prefetch"):
            data = ({"kind": "offload", "tensor": self.tensor, "to": self.to, "after": self.after}
                    if self.kind == "offload" else
                    {"kind": "prefetch", "tensor": self.tensor, "from": self.source, "after": self.after,
                     "before": self.before})
            if self.codec is not None:
                data["codec"] = self.codec
            if self.group is not None:
                data["group"] = self.group
            return data
        if self.kind == "encode":
            return {"kind": "encode", "tensor": self.tensor, "after": self.after, "codec": self.codec}
        if self.kind == "decode":
            return {"kind": "decode", "tensor": self.tensor, "before": self.before, "codec": self.codec}
        if self.kind in ("drop", "load", "store"):
            return {"kind": self.kind, "tensor": self.tensor, "after": self.after}
        return {"kind": "recompute", "tensor": self.tensor, "before": self.before}

    def label(self) -> str:
        return f"{self.kind} {self.tensor}"


def offload(tensor: str, after: str | None, to: str = "host", codec: str | None = None) -> Action:
    return Action("offload", tensor, to=to, after=after, codec=codec)


def prefetch(tensor: str, after: str | None, before: str | None, source: str = "host",
             codec: str | None = None) -> Action:
    return Action("prefetch", tensor, source=source, after=after, before=before, codec=codec)


def encode(tensor: str, after: str, codec: str) -> Action:
    return Action("encode", tensor, after=after, codec=codec)


def decode(tensor: str, before: str, codec: str) -> Action:
    return Action("decode", tensor, before=before, codec=codec)


def drop(tensor: str, after: str) -> Action:
    return Action("drop", tensor, after=after)


def recompute(tensor: str, before: str) -> Action:
    return Action("recompute", tensor, before=before)


def load(tensor: str, after: str | None) -> Action:
    return Action("load", tensor, source="ssd", after=after)


def store(tensor: str, after: str | None) -> Action:
    return Action("store", tensor, to="ssd", after=after)


@dataclass(frozen=True)
class Placement:
    """A plan's ``placement`` (R50): the arena's size and an offset per allocation key
    (simulator/model/allocation.py names the keys and checks a placement against them)."""
    arena_bytes: int
    offsets: dict

    def to_dict(self) -> dict:
        return {"arena_bytes": self.arena_bytes, "offsets": dict(sorted(self.offsets.items()))}


@dataclass(frozen=True)
class PlannerInfo:
    """Who made the plan, with which parameters, how long it took and how it ended."""
    name: str = "none"
    params: dict = field(default_factory=dict)
    seconds: float | None = None  # left out of exported plans so they stay byte-identical
    status: str = "ok"
    gap: float | None = None
    seed: int | None = None
    notes: dict = field(default_factory=dict)      # what the planner says of its run
    estimate_us: float | None = None               # the planner's own prediction, if it has one
    lower_bound_us: float | None = None            # no plan of its kind is faster (planner/shared/bound.py)
    bound: str | None = None                       # which bound: swap | swap+recompute (+persistent)

    def to_dict(self) -> dict:
        data = {"name": self.name, "params": self.params, "status": self.status}
        for key in ("seconds", "gap", "seed", "estimate_us", "lower_bound_us", "bound"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        if self.notes:
            data["notes"] = self.notes
        return data


@dataclass
class Plan:
    """A plan for one profile; ``actions`` in the order the runtime issues them."""
    profile_name: str
    actions: tuple[Action, ...] = ()
    profile_sha256: str | None = None
    hardware: str | None = None
    budget_bytes: int | None = None
    planner: PlannerInfo = field(default_factory=PlannerInfo)
    schedule: tuple[str, ...] | None = None
    initial: dict[str, str] = field(default_factory=dict)
    predicted: dict | None = None
    cpu_ops: tuple[str, ...] = ()              # ops run on the host CPU (R24)
    memory: str = "explicit"                   # "uvm": every tensor in managed memory (R30-R37)
    read_mostly: tuple[str, ...] = ()          # UVM: tensors advised read-mostly (R34)
    uvm_backing: str | None = None             # UVM: "host" | "ssd" (R35); None: the machine's uvm.backing
    allow_lossy: bool = False                  # lossy codecs (fp16, bf16, int8) may be used (R40)
    placement: Placement | None = None         # an offset per GPU allocation in one arena (R50)
    variants: dict[str, str] = field(default_factory=dict)   # op id -> the variant it runs (R52)
    splits: dict[str, int] = field(default_factory=dict)     # op id -> the chunks it runs in (R54)
    origin: str = field(default="<plan>", compare=False)

    @property
    def uses_cpu(self) -> bool:
        """Does the plan place ops on the CPU or move tensors between SSD and host?"""
        return bool(self.cpu_ops) or any(a.kind in HOST_KINDS for a in self.actions)

    @property
    def uvm(self) -> bool:
        """Is the plan in UVM mode (R30-R37: the Python engine runs it, not the C path)?"""
        return self.memory == "uvm"

    @property
    def uses_codecs(self) -> bool:
        """Does the plan compress transfers or encode tensors on the GPU (R40-R42)?"""
        return any(a.codec is not None for a in self.actions)

    @property
    def reference_only(self) -> bool:
        """Only the Python engine runs it: the C fast path has no CPU stream, no UVM and
        no codecs, no op variants and no groups, and counts bytes, not address ranges."""
        return (self.uvm or self.uses_cpu or self.uses_codecs or self.placement is not None or bool(self.variants)
                or self.uses_groups)

    @property
    def uses_groups(self) -> bool:
        """Are some transfers grouped into one (R53)?"""
        return any(a.group is not None for a in self.actions)

    def to_dict(self) -> dict:
        profile = {"name": self.profile_name}
        if self.profile_sha256:
            profile["sha256"] = self.profile_sha256
        data = {
            "format": FORMAT,
            "profile": profile,
            "hardware": self.hardware,
            "budget_bytes": self.budget_bytes,
            "planner": self.planner.to_dict(),
            "schedule": None if self.schedule is None else list(self.schedule),
            "initial": dict(sorted(self.initial.items())),
            "actions": [a.to_dict() for a in self.actions],
            "predicted": self.predicted,
        }
        if self.cpu_ops:
            data["cpu_ops"] = list(self.cpu_ops)
        if self.memory != "explicit":
            data["memory"] = self.memory
        if self.read_mostly:
            data["read_mostly"] = list(self.read_mostly)
        if self.uvm_backing is not None:
            data["uvm_backing"] = self.uvm_backing
        if self.allow_lossy:
            data["allow_lossy"] = True
        if self.placement is not None:
            data["placement"] = self.placement.to_dict()
        if self.variants:
            data["variants"] = dict(sorted(self.variants.items()))
        if self.splits:
            data["splits"] = dict(sorted(self.splits.items()))
        return data


def empty_plan(profile: Profile, hardware: str | None = None, budget_bytes: int | None = None) -> Plan:
    """The plan that swaps nothing (what ``simulate`` without a plan runs)."""
    return Plan(profile_name=profile.name, profile_sha256=profile_sha256(profile),
                hardware=hardware, budget_bytes=budget_bytes)


# ----------------------------------------------------------------------------- schema


def schema_path() -> Path:
    return Path(str(importlib.resources.files("plans") / "schema.json"))


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_path().read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def _where(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "top level"


def plan_from_dict(data, file: str = "<plan>") -> Plan:
    """Validate parsed JSON against the plan schema and build a Plan.

    Raises InputError naming the file, the field and the problem.
    """
    if isinstance(data, dict) and isinstance(data.get("actions"), list) and len(data["actions"]) > MAX_COUNT:
        raise InputError(file, "actions", f"{len(data['actions'])} actions; at most {MAX_COUNT} are supported (R23)")
    errors = _schema_errors(data)
    if errors:
        error = _most_precise(errors)
        raise InputError(file, _where(error.absolute_path), _schema_message(error))
    budget = data.get("budget_bytes")
    if budget is not None and budget >= MAX_BYTES:
        raise InputError(file, "budget_bytes", f"{budget} bytes is too large: at most 2^53 - 1 (R23)")
    actions = []
    for item in data["actions"]:
        kind = item["kind"]
        actions.append(Action(kind=kind, tensor=item["tensor"], to="ssd" if kind == "store" else item.get("to"),
                              source="ssd" if kind == "load" else item.get("from"), after=item.get("after"),
                              before=item.get("before"), codec=item.get("codec"), group=item.get("group")))
    raw_planner = data.get("planner") or {"name": "unknown"}
    planner = PlannerInfo(name=raw_planner["name"], params=raw_planner.get("params", {}),
                          seconds=raw_planner.get("seconds"),
                          status=raw_planner.get("status", "ok"), gap=raw_planner.get("gap"),
                          seed=raw_planner.get("seed"), notes=raw_planner.get("notes", {}),
                          estimate_us=raw_planner.get("estimate_us"),
                          lower_bound_us=raw_planner.get("lower_bound_us"), bound=raw_planner.get("bound"))
    schedule = data.get("schedule")
    return Plan(
        profile_name=data["profile"]["name"],
        profile_sha256=data["profile"].get("sha256"),
        actions=tuple(actions),
        hardware=data.get("hardware"),
        budget_bytes=data.get("budget_bytes"),
        planner=planner,
        schedule=None if schedule is None else tuple(schedule),
        initial=dict(data.get("initial") or {}),
        predicted=data.get("predicted"),
        cpu_ops=tuple(data.get("cpu_ops") or ()),
        memory=data.get("memory", "explicit"),
        read_mostly=tuple(data.get("read_mostly") or ()),
        uvm_backing=data.get("uvm_backing"),
        allow_lossy=bool(data.get("allow_lossy", False)),
        placement=None if data.get("placement") is None else
        Placement(data["placement"]["arena_bytes"], dict(data["placement"]["offsets"])),
        variants=dict(data.get("variants") or {}),
        splits=dict(data.get("splits") or {}),
        origin=file,
    )


def _schema_errors(data) -> list:
    """The schema's errors, sorted. The actions and the schedule (the bulk of a large
    plan) are checked inline when they are well formed, the rest by jsonschema; any
    doubt runs jsonschema on the whole document, so its messages are the same."""
    if isinstance(data, dict) and _actions_ok(data.get("actions")) and _schedule_ok(data.get("schedule", None)):
        light = dict(data, actions=[])
        if data.get("schedule") is not None:
            light["schedule"] = []
        if not any(True for _ in _validator().iter_errors(light)):
            return []
    return sorted(_validator().iter_errors(data),
                  key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))


# The fields each action kind must have, exactly (the schema's required and
# additionalProperties: false), and which of them may be null.
_ACTION_KEYS = {"offload": frozenset({"kind", "tensor", "to", "after"}),
                "prefetch": frozenset({"kind", "tensor", "from", "after", "before"}),
                "drop": frozenset({"kind", "tensor", "after"}),
                "recompute": frozenset({"kind", "tensor", "before"}),
                "load": frozenset({"kind", "tensor", "after"}),
                "store": frozenset({"kind", "tensor", "after"}),
                "encode": frozenset({"kind", "tensor", "after", "codec"}),
                "decode": frozenset({"kind", "tensor", "before", "codec"})}
_OPTIONAL_KEYS = frozenset({"codec", "group"})     # an offload's or prefetch's optional fields
_NULLABLE = {"offload": ("after",), "prefetch": ("after", "before"), "drop": (), "recompute": (),
             "load": ("after",), "store": ("after",), "encode": (), "decode": ()}


def _actions_ok(actions) -> bool:
    """True when every action is one the schema accepts (checked without jsonschema)."""
    if type(actions) is not list:
        return False
    for item in actions:
        if type(item) is not dict:
            return False
        kind = item.get("kind")
        if type(kind) is not str or kind not in _ACTION_KEYS:
            return False
        if item.keys() != _ACTION_KEYS[kind]:
            if kind not in ("offload", "prefetch") or not (_ACTION_KEYS[kind] <= item.keys() <= _ACTION_KEYS[kind]
                                                           | _OPTIONAL_KEYS):
                return False
            for key in _OPTIONAL_KEYS & item.keys():
                if type(item[key]) is not str or not item[key]:
                    return False
        tensor = item["tensor"]
        if type(tensor) is not str or not tensor:
            return False
        tier = item.get("to", item.get("from"))
        if kind in ("offload", "prefetch") and tier not in TIERS:
            return False
        nullable = _NULLABLE[kind]
        for key in ("after", "before"):
            if key in item:
                value = item[key]
                if value is None and key in nullable:
                    continue
                if type(value) is not str or not value:
                    return False
    return True


def _schedule_ok(schedule) -> bool:
    return schedule is None or is_id_list(schedule)


def _most_precise(errors):
    """The deepest error: it points at the field that is actually wrong."""
    deepest = max(len(e.absolute_path) for e in errors)
    for error in errors:
        if len(error.absolute_path) == deepest:
            return error
    return errors[0]


def _schema_message(error) -> str:
    if error.validator == "required":
        return error.message.replace("is a required property", "is missing (required)")
    if error.validator == "additionalProperties":
        return error.message.replace("Additional properties are not allowed", "unknown field")
    if error.validator in ("const", "enum"):
        allowed = error.validator_value if error.validator == "enum" else [error.validator_value]
        return f"{json.dumps(error.instance)[:40]} is not one of {', '.join(map(str, allowed))}"
    message = error.message
    return message if len(message) <= 160 else message[:157] + "..."


def load_plan(path: str | Path) -> Plan:
    """Load a plan (JSON, gzipped JSON or YAML) and validate it against the schema."""
    return plan_from_dict(read_document(path), str(path))


def plan_json(plan: Plan) -> str:
    """The saved text: stable key order, one action per line."""
    data = plan.to_dict()
    actions = data.pop("actions")
    body = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False)
    lines = ",\n  ".join(json.dumps(a, sort_keys=True, ensure_ascii=False) for a in actions)
    action_text = f'"actions": [\n  {lines}\n ]' if actions else '"actions": []'
    return body[:-2] + ",\n " + action_text + "\n}\n"


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write the plan JSON atomically."""
    write_atomic(path, plan_json(plan).encode("utf-8"))


# ----------------------------------------------------------------------------- structure


def check_plan(plan: Plan, profile: Profile, has_ssd: bool = True, has_cpu: bool = True) -> None:
    """Check a plan's structure against its profile: what makes it an input error rather
    than a plan that breaks a rule (docs/simulation.md: rule breaks are results).

    Raises InputError naming the plan's file, the field and the problem for: a profile
    sha256 that does not match, an unknown tensor or op, a schedule that is not a
    permutation of the profile's ops, an unknown tier, more than 10^7 actions (R23), and
    an SSD action or placement on a machine without an SSD (``has_ssd`` False), and ops
    on the CPU of a machine that describes none (``has_cpu`` False).
    """
    file = plan.origin
    if plan.profile_sha256 and plan.profile_sha256 != profile_sha256(profile):
        raise InputError(file, "profile.sha256", other_profile_problem(plan, profile))
    _check_structure(plan, profile, file, has_ssd, has_cpu)


def other_profile_problem(plan: Plan, profile: Profile) -> str:
    """Why a plan whose ``profile.sha256`` differs from the profile's does not run on it:
    made for another profile, or, under the same name, for other contents (a profile
    traced or edited again): both hashes' first characters then tell them apart."""
    mine = profile_sha256(profile)
    if plan.profile_name == profile.name:
        return (f"plan was made for another profile of the same name {profile.name!r}: the contents differ "
                f"(sha256 {plan.profile_sha256[:12]}... in the plan, {mine[:12]}... of this profile); plan this "
                "profile again")
    return f"plan was made for another profile ({plan.profile_name!r}); it does not match {profile.name!r}"


def _check_structure(plan: Plan, profile: Profile, file: str, has_ssd: bool, has_cpu: bool) -> None:
    """The rest of ``check_plan``, once the plan is known to be for this profile."""
    if plan.splits:   # R54: the actions name the chunks and slices of the profile the plan runs
        profile = split_profile(profile, plan.splits, file)
        plan = replace(plan, splits={}, profile_sha256=None)
    if len(plan.actions) > MAX_COUNT:
        raise InputError(file, "actions", f"{len(plan.actions)} actions; at most {MAX_COUNT} are supported (R23)")
    if plan.schedule is not None:
        problem = schedule_problem(profile, plan.schedule)
        if problem is not None:
            raise InputError(file, "schedule", problem)
    for tid, tier in plan.initial.items():
        if tid not in profile.tensor_by_id:
            raise InputError(file, f"initial.{tid}", f"unknown tensor {tid!r}")
        if tier not in TIERS:
            raise InputError(file, f"initial.{tid}", f"must be one of {', '.join(TIERS)}, not {tier!r}")
        if tier == "ssd" and not has_ssd:
            raise InputError(file, f"initial.{tid}", "the hardware has no SSD")
    tensors, op_index = profile.tensor_by_id, profile.op_index
    for i, action in enumerate(plan.actions):
        problem = _field_problem(action)
        if problem is not None:
            raise InputError(file, f"{_action_where(i, action)}.{problem[0]}", problem[1])
        if action.tensor not in tensors:
            raise InputError(file, f"{_action_where(i, action)}.tensor", f"unknown tensor {action.tensor!r}")
        for key, op_id in (("after", action.after), ("before", action.before)):
            if op_id is not None and op_id not in op_index:
                raise InputError(file, f"{_action_where(i, action)}.{key}", f"unknown op {op_id!r}")
        if not has_ssd and "ssd" in (action.to, action.source):
            key = {"offload": "to", "prefetch": "from"}.get(action.kind, "kind")
            raise InputError(file, f"{_action_where(i, action)}.{key}", "the hardware has no SSD")
    for op_id, name in plan.variants.items():
        if op_id not in op_index:
            raise InputError(file, f"variants.{op_id}", f"unknown op {op_id!r}")
        if profile.ops[op_index[op_id]].variant(name) is None:
            known = ", ".join(v.name for v in profile.ops[op_index[op_id]].variants) or "none"
            raise InputError(file, f"variants.{op_id}", f"op {op_id!r} has no variant {name!r} (its variants: "
                                                        f"{known})")
    if plan.cpu_ops and not has_cpu:
        raise InputError(file, "cpu_ops", "the hardware describes no CPU (a `cpu` section: tflops, mem_gbps, "
                                          "launch_us) to run these ops on")
    if plan.memory not in MEMORY_MODES:
        raise InputError(file, "memory", f"must be one of {', '.join(MEMORY_MODES)}, not {plan.memory!r}")
    if plan.read_mostly and plan.memory != "uvm":
        raise InputError(file, "read_mostly", 'read-mostly advice is for plans with "memory": "uvm" (R34)')
    if plan.uvm_backing is not None:
        if plan.memory != "uvm" or plan.uvm_backing not in TIERS:
            raise InputError(file, "uvm_backing", 'must be host or ssd, in a plan with "memory": "uvm" (R35)')
        if plan.uvm_backing == "ssd" and not has_ssd:
            raise InputError(file, "uvm_backing", "the hardware has no SSD")
    for i, tid in enumerate(plan.read_mostly):
        if tid not in tensors:
            raise InputError(file, f"read_mostly[{i}]", f"unknown tensor {tid!r}")
    seen = set()
    for i, op_id in enumerate(plan.cpu_ops):
        if op_id not in op_index:
            raise InputError(file, f"cpu_ops[{i}]", f"unknown op {op_id!r}")
        if op_id in seen:
            raise InputError(file, f"cpu_ops[{i}]", f"op {op_id!r} is listed twice")
        seen.add(op_id)


def _field_problem(action: Action) -> tuple[str, str] | None:
    """The fields the schema requires of each kind, for plans built in memory (a file's
    plan was already checked against the schema): (field, problem) or None."""
    if action.kind not in ACTION_KINDS:
        return "kind", f"unknown action kind {action.kind!r} (one of {', '.join(ACTION_KINDS)})"
    if action.kind == "offload" and action.to not in TIERS:
        return "to", f"must be one of {', '.join(TIERS)}, not {action.to!r}"
    if action.kind == "prefetch" and action.source not in TIERS:
        return "from", f"must be one of {', '.join(TIERS)}, not {action.source!r}"
    if action.kind == "drop" and action.after is None:
        return "after", "a drop needs the op after which it happens"
    if action.kind == "recompute" and action.before is None:
        return "before", "a recompute needs the op it runs before"
    if action.kind == "encode" and action.after is None:
        return "after", "an encode needs the op after which it runs"
    if action.kind == "decode" and action.before is None:
        return "before", "a decode needs the op it runs before"
    if action.kind in CODEC_KINDS and not action.codec:
        return "codec", f"an {action.kind} needs a codec"
    if action.codec is not None and action.kind not in ("offload", "prefetch") + CODEC_KINDS:
        return "codec", f"a {action.kind} takes no codec"
    if action.group is not None and action.kind not in ("offload", "prefetch"):
        return "group", f"a {action.kind} takes no group (offloads and prefetches do, R53)"
    return None


def _action_where(i: int, action: Action) -> str:
    return f"actions[{i}] ({action.label()})"
