"""Fuzz the command line with careless and hostile input, for as long as you like.

Run: ``.venv/bin/python benchmarks/fuzz_cli.py --seconds 600 [--seed N] [--full]``;
``--quick --cases 6`` is the CI-sized run tests/test_fuzz_cli.py makes.

Each case is a real ``swapplan`` process in a fresh folder, under a time limit and a
memory limit. A case fails when the process exits with anything but 0, 1 or 2 (3 is an
internal error), prints a traceback without ``--debug`` (or a MemoryError), prints more
than one error line (or one over 400 characters), runs past the time limit (a hang) or
the memory limit (a blow-up), changes anything in its folder but the outputs it was
asked to write, or loses a result row another run wrote. Failures are copied to
``--keep`` (default ``fuzz-failures/``) with the command, to reproduce.

The cases, in order:

- the hostile inputs of issue 17 (``--full`` builds them at full size: a 1 GB gzip bomb,
  a 9-level YAML alias bomb, a 600k-op profile);
- the commands and plan kinds added since (issue 33): ``place``, ``variants``,
  ``compare``, ``replay``, ``trace --hf-config`` and ``--density-file`` (FIFOs, devices,
  configs asking for 10^9 layers or 2^21-wide layers, a byte-order mark, an
  out-of-range ``--density-seed``, torch missing), UVM, codec, placement, variant, group
  and CPU-op plans, and hardware files with bad ``uvm``, ``codecs`` and ``cpu`` sections;
  with ``--slow`` (implied by ``--full``) also cases that trace or train for real
  (``trace --density``, ``trace --hf-config``, ``train``: torch, some seconds each);
- shared output folders (issue 49): ``compare`` runs into one ``--out`` folder after
  another and at the same time, each judged as above, and the folder's
  ``results.json`` must hold every row of every run;
- random mutations, for ``--seconds`` or ``--cases``: of a small valid profile, hardware
  file and plan (values swapped for extreme numbers, long or odd strings, wrong types;
  keys dropped; files swapped for FIFOs, links, folders and devices), of the command
  line (budgets, --top, outputs), of the plans of every kind above and the hardware
  sections they use, of a variants CSV, and (with ``--slow``) of a transformers config.

``--quick`` keeps a fixed selection of the fixed cases (those marked quick: one or more
per command and every case of issue 33) and the random kinds that need no torch.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import gzip
import json
import os
import random
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from simulator.hardware import preset_dir  # noqa: E402
from tests.conftest import TWO_LAYER_OPS, TWO_LAYER_TENSORS, profile_dict  # noqa: E402
from tests.hostile import alias_bomb, node_paths, two_layer_plan  # noqa: E402

EXTREME = [0, -1, 1, 2**53 - 1, 2**53, 2**62, 2**63, 2**64, 2**70, 1e20, 1e308, -1e308, 5e-324, 1e-10,
           1.5, "1e400GiB", "8191PiB", "10000PiB", "60%", "", " ", "\ud800", "x" * 100_000, None, True,
           [], {}, [[[]]], "NaN", "Infinity", 10**4000]
BUDGETS = ["1e308%", "1e400GiB", "0", "1", "60%", "100%", "1000%", "-5%", "9" * 5000, "8GiB", "0.0001%",
           "1e-400GiB", "nan%", "inf", "%", "5 GB"]
BOM = b"\xef\xbb\xbf"
NO_TORCH = "import sys; sys.modules['torch'] = None; "   # a prelude: as if the trace extra were missing
# A config of a transformers causal LM small enough to trace in seconds.
TINY_CONFIG = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 128,
               "max_position_embeddings": 64}
TINY_MODEL = '''import torch

def build(batch=16):
    with torch.device("meta"):
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return net, (torch.empty(batch, 8),), torch.nn.functional.cross_entropy, (torch.empty(batch, dtype=torch.long),)
'''


def _hardware() -> dict:
    return yaml.safe_load((preset_dir() / "a100-40gb-pcie4.yaml").read_text())


def _profile() -> dict:
    return profile_dict(TWO_LAYER_TENSORS, TWO_LAYER_OPS, "two-layer")


def _plan() -> dict:
    return two_layer_plan()


def _group_plan() -> dict:
    """Two offloads of the two-layer profile moved as one transfer (R53)."""
    return {"format": "swapplan-plan/1", "profile": {"name": "two-layer"}, "hardware": "a100-40gb-pcie4",
            "budget_bytes": 500,
            "actions": [{"kind": "offload", "tensor": "a1", "to": "host", "after": "f2", "group": "g0"},
                        {"kind": "offload", "tensor": "x", "to": "host", "after": "f2", "group": "g0"},
                        {"kind": "prefetch", "tensor": "a1", "from": "host", "after": "loss", "before": "b2"},
                        {"kind": "prefetch", "tensor": "x", "from": "host", "after": "loss", "before": "b1"}]}


# ----------------------------------------------------------------------------- feature seeds

_FEATURES: dict | None = None
_FEATURES_LOCK = threading.Lock()
FEATURE_PLANS = ("lms", "uvm", "codec", "variant", "cpu", "placed")


def feature_files() -> dict:
    """Seeds of every plan kind, made once by the planners themselves: ``m.json`` (an
    8-layer MLP profile with activation densities and a variant on every third op) and
    its plans ``lms.json`` (explicit swaps), ``uvm.json`` (UVM mode), ``codec.json``
    (cdma: compressed copies), ``variant.json`` (modnn: op variants), ``cpu.json``
    (zero-offload: ops on the CPU), ``placed.json`` (lms placed by SmartPool), and
    ``group.json`` (grouped transfers of the two-layer profile) and ``v.csv`` (variants)."""
    global _FEATURES
    with _FEATURES_LOCK:
        if _FEATURES is None:
            _FEATURES = _build_features()
        return dict(_FEATURES)


def _build_features() -> dict:
    from planner.core.api import make_plan
    from planner.shared.placement import place
    from simulator.hardware import load_hardware
    from simulator.plan import plan_json
    from simulator.profile import Profile, Variant, save_profile
    from tracer.density import with_densities
    from tracer.synthetic import synthesize

    profile = synthesize("mlp", layers=8, width=128, batch=4096)
    profile = with_densities(profile, {t.id: 0.3 for t in profile.tensors if t.kind == "activation"})
    ops = tuple(dataclasses.replace(op, variants=(Variant("alt", op.time_us * 0.5, 4096),)) if k % 3 == 0 else op
                for k, op in enumerate(profile.ops))
    profile = Profile(name=profile.name, tensors=profile.tensors, ops=ops, source=profile.source,
                      origin=profile.origin)
    hardware = load_hardware("a100-40gb-pcie4")
    budget = int(profile.peak_bytes * 0.85)
    files: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        save_profile(profile, Path(tmp) / "m.json")
        files["m.json"] = (Path(tmp) / "m.json").read_bytes()
    for name, planner in (("lms", "lms"), ("uvm", "uvm"), ("codec", "cdma"), ("variant", "modnn")):
        files[f"{name}.json"] = plan_json(make_plan(profile, hardware, budget, planner).plan)
    # (zero-offload's plan runs here only near the peak: its CPU step waits for the whole gradients)
    files["cpu.json"] = plan_json(make_plan(profile, hardware, int(profile.peak_bytes * 0.99), "zero-offload").plan)
    lms = make_plan(profile, hardware, budget, "lms").plan
    files["placed.json"] = plan_json(place(profile, lms, hardware, budget, "smartpool")[0])
    files["group.json"] = _group_plan()
    first = profile.ops[1].id
    files["v.csv"] = f"op,name,time_us,workspace_bytes\n{first},fast,1.5,1024\n{first},lean,9,0\n"
    return files


# ----------------------------------------------------------------------------- one case


class Case:
    """Files to write into a fresh folder and a command to run there.

    ``outputs``: names the command may create or change (a name ending in ``/``: a
    folder and everything in it). ``prelude``: Python run before the command (e.g.
    :data:`NO_TORCH`). ``quick``: part of the ``--quick`` selection. ``slow``: runs
    torch for real (only with ``--slow``). ``setup``: commands run first, one after the
    other (each must exit 0), whose files are part of the folder the case starts from;
    ``also``: commands run at the same time as ``args`` in the same folder, each judged
    as it is; ``rows``: (a results.json, the rows it must hold at the end): nothing
    lost."""

    def __init__(self, name: str, args: list[str], files: dict | None = None, outputs: tuple = (),
                 special: dict | None = None, env: dict | None = None, prelude: str = "",
                 quick: bool = False, slow: bool = False, setup: tuple = (), also: tuple = (),
                 rows: tuple[str, int] | None = None):
        self.name, self.args, self.files = name, args, files or {}
        self.outputs, self.special, self.env = set(outputs), special or {}, env or {}
        self.prelude, self.quick, self.slow = prelude, quick, slow
        self.setup, self.also, self.rows = list(setup), list(also), rows

    def build(self, folder: Path) -> None:
        for name, content in self.files.items():
            if name in self.special:   # the special entry replaces the file
                continue
            path = folder / name
            if isinstance(content, bytes):
                path.write_bytes(content)
            elif isinstance(content, str):
                path.write_text(content, errors="surrogatepass")
            else:
                path.write_text(json.dumps(content))
        for name, kind in self.special.items():
            path = folder / name
            if kind == "fifo":
                os.mkfifo(path)
            elif kind == "dir":
                path.mkdir()
            elif kind.startswith("link:"):
                os.symlink(kind[5:], path)

    def command(self) -> str:
        lines = [" ".join(a[:60] for a in args) for args in (*self.setup, self.args, *self.also)]
        line = "swapplan " + (" ; swapplan ".join(lines[:len(self.setup) + 1]) if self.setup else lines[0])
        if self.also:
            line = " & ".join([line, *("swapplan " + other for other in lines[len(self.setup) + 1:])])
        return f"({self.prelude.strip()}) {line}" if self.prelude else line


def _snapshot(folder: Path) -> dict:
    out = {}
    for path in folder.rglob("*"):
        info = os.lstat(path)
        out[str(path.relative_to(folder))] = (stat.S_IFMT(info.st_mode), info.st_size, info.st_mtime_ns,
                                              os.readlink(path) if stat.S_ISLNK(info.st_mode) else None)
    return out


def _limit_memory(limit_bytes: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return apply


def _allowed(name: str, outputs: set) -> bool:
    return any(name == out.rstrip("/") or (out.endswith("/") and name.startswith(out)) for out in outputs)


def run_case(case: Case, timeout: float, memory: int) -> str | None:
    """None when the case behaved, else what went wrong."""
    with tempfile.TemporaryDirectory(prefix="swapplan-fuzz-") as tmp:
        folder = Path(tmp)
        case.build(folder)
        env = dict(os.environ, PYTHONPATH=str(ROOT), **case.env)

        def start(args):
            return subprocess.Popen([sys.executable, "-c", f"{case.prelude}import cli; cli.main()", *args],
                                    cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                    stdin=subprocess.DEVNULL, preexec_fn=_limit_memory(memory))

        for args in case.setup:
            done = subprocess.run([sys.executable, "-c", "import cli; cli.main()", *args], cwd=folder, env=env,
                                  capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                return f"setup {' '.join(args)[:80]} exit {done.returncode}: {done.stderr.decode()[-200:]}"
        before = _snapshot(folder)
        started = time.monotonic()
        processes = [(args, start(args)) for args in (case.args, *case.also)]
        problems = []
        for args, process in processes:
            try:
                _, err = process.communicate(timeout=max(1.0, timeout - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                for _, other in processes:
                    other.kill()
                    other.communicate()
                return f"hang: still running after {timeout:.0f} s"
            problems += _judge(process.returncode, err.decode("utf-8", "replace"), "--debug" in args)
        seconds = time.monotonic() - started
        after = _snapshot(folder)
        changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
        changed = {k for k in changed if not _allowed(k, case.outputs)}
        if changed:
            problems.append(f"touched {sorted(changed)[:5]}")
        if case.rows is not None:
            problems += _rows_kept(folder / case.rows[0], case.rows[1])
        if problems:
            return "; ".join(problems) + f" ({seconds:.1f} s)"
    return None


def _judge(code: int, err: str, debug: bool) -> list[str]:
    """What is wrong with one process's exit status and stderr (run_case's rules)."""
    problems = []
    if code not in (0, 1, 2):
        problems.append(f"exit {code}")
    if ("Traceback" in err and not debug) or "MemoryError" in err:
        problems.append("traceback or MemoryError")
    errors = [line for line in err.splitlines() if not line.startswith(("note: ", "tracing ", "  "))]
    errors = errors[-1:] if debug else errors   # the traceback is asked for; the last line is the error
    if code == 2 and (len(errors) != 1 or len(errors[0]) > 400):
        problems.append(f"{len(errors)} error lines, longest {max(map(len, errors), default=0)} characters")
    return [f"{problem}: {err.strip()[-300:]}" for problem in problems]


def _rows_kept(path: Path, want: int) -> list[str]:
    """A problem when ``path`` (a results.json) is unreadable or holds other than ``want`` rows."""
    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{path.name} unreadable: {exc}"]
    return [] if len(rows) == want else [f"{path.parent.name}/{path.name} holds {len(rows)} rows, not {want}: lost"]


# ----------------------------------------------------------------------------- the fixed cases


def hostile_cases(full: bool) -> list[Case]:
    """The inputs issue 17 lists, at full size with ``full``."""
    base = {"p.json": _profile(), "plan.json": _plan()}
    cases = []

    def profile_case(name, change, command=("simulate",)):
        data = _profile()
        change(data)
        cases.append(Case(name, [*command, "bad.json"], {"bad.json": data}))

    profile_case("tensor 2^63", lambda d: d["tensors"][3].update(bytes=2**63))
    profile_case("tensor 1e20", lambda d: d["tensors"][3].update(bytes=1e20))
    profile_case("time 1e308", lambda d: d["ops"][0].update(time_us=1e308), ("simulate", "--json"))
    for field, value in (("gpu.memory", 2**70), ("host.memory", "10000PiB"), ("ssd.capacity", 2**64),
                         ("pcie.h2d_gbps", 5e-324), ("pcie.latency_us", 1e308), ("gpu.memory", "8191PiB")):
        hardware = _hardware()
        part, key = field.split(".")
        hardware[part][key] = value
        cases.append(Case(f"hardware {field}={value}", ["simulate", "p.json", "--hardware", "hw.yaml"],
                          {**base, "hw.yaml": yaml.safe_dump(hardware)}, quick=field == "pcie.h2d_gbps"))
    for budget in BUDGETS:
        cases.append(Case(f"budget {budget[:20]}", ["simulate", "p.json", "--budget", budget], base))
    text = json.dumps(_profile()).replace('"a2"', '"\\ud800"')
    for command in (["validate"], ["info"], ["simulate"], ["plan", "--budget", "90%"]):
        cases.append(Case(f"surrogate {command[0]}", [command[0], "s.json", *command[1:]], {"s.json": text}))
    for levels in (7, 9):
        for command in ("validate", "info", "simulate"):
            cases.append(Case(f"alias bomb {levels} {command}", [command, "bomb.yaml"],
                              {"bomb.yaml": alias_bomb(levels)}))
    cases.append(Case("fifo profile", ["info", "f.json"], special={"f.json": "fifo"}, quick=True))
    cases.append(Case("fifo plan", ["simulate", "p.json", "f.json"], base, special={"f.json": "fifo"}))
    plan = _plan()
    plan["hardware"] = "/dev/stdin"
    cases.append(Case("plan hardware /dev/stdin", ["simulate", "p.json", "pl.json"], {**base, "pl.json": plan}))
    cases.append(Case("/dev/zero", ["info", "/dev/zero"]))
    inflated = (1 << 30) if full else (8 << 20)
    env = {} if full else {"SWAPPLAN_MAX_INPUT_BYTES": "4MiB"}
    cases.append(Case(f"gzip bomb {inflated >> 20} MiB", ["info", "bomb.json.gz"],
                      {"bomb.json.gz": gzip.compress(b" " * inflated, 9)}, env=env))
    for option in ("--timeline", "--plot"):
        cases.append(Case(f"{option} symlink", ["simulate", "p.json", "plan.json", option, "l.json"],
                          {**base, "t.txt": "keep"}, special={"l.json": "link:t.txt"}))
        cases.append(Case(f"{option} fifo", ["simulate", "p.json", option, "o.json"], base,
                          special={"o.json": "fifo"}))
        cases.append(Case(f"{option} /dev/full", ["simulate", "p.json", option, "/dev/full"], base))
    cases.append(Case("no arguments", ["simulate"]))
    cases.append(Case("--top -1", ["info", "--top", "-1", "p.json"], base))
    long_id = _profile()
    long_id["ops"][0]["inputs"][0] = "x" * 1_000_000
    cases.append(Case("1 MB dangling id", ["validate", "l.json"], {"l.json": long_id}))
    cases.append(Case("--debug", ["--debug", "info", "none.json"]))
    cases.append(Case("synth 10^7 layers", ["synth", "mlp", "--layers", "10000000", "-o", "m.json"],
                      outputs=("m.json",)))
    if full:
        cases.append(Case("600k-op profile", ["validate", "big.json"], {"big.json": _long_profile(600_000)}))
    return cases


def _config(**change) -> dict:
    return {**TINY_CONFIG, **change}


def trace_cases() -> list[Case]:
    """``trace``: every input a regular file, configs bounded before anything is built,
    ``--density-seed`` in torch's range, one line when torch is missing (issue 33)."""
    out = ("o.json",)
    cases = []
    for name, special in (("fifo", {"c.json": "fifo"}), ("folder", {"c.json": "dir"}),
                          ("link to a fifo", {"f": "fifo", "c.json": "link:f"})):
        cases.append(Case(f"trace --hf-config {name}", ["trace", "--hf-config", "c.json", "-o", "o.json"],
                          special=special, outputs=out, quick=name == "fifo"))
    for device in ("/dev/zero", "/dev/urandom", "/dev/stdin"):
        cases.append(Case(f"trace --hf-config {device}", ["trace", "--hf-config", device, "-o", "o.json"],
                          outputs=out, quick=device == "/dev/zero"))
    cases.append(Case("trace --density-file fifo", ["trace", "gpt2", "--density-file", "d.json", "-o", "o.json"],
                      special={"d.json": "fifo"}, outputs=out, quick=True))
    cases.append(Case("trace --density-file /dev/zero",
                      ["trace", "gpt2", "--density-file", "/dev/zero", "-o", "o.json"], outputs=out))
    cases.append(Case("trace --hardware fifo", ["trace", "gpt2", "--hardware", "h.yaml", "-o", "o.json"],
                      special={"h.yaml": "fifo"}, outputs=out))
    for label, change, quick in (("10^9 layers", {"num_hidden_layers": 10**9}, True),
                                 ("10^4 layers", {"num_hidden_layers": 10_000}, False),
                                 ("n_layer 10^9 (gpt2)", {"model_type": "gpt2", "n_layer": 10**9}, False),
                                 ("hidden 2^21", {"hidden_size": 2**21, "num_attention_heads": 2**11,
                                                  "num_key_value_heads": 2**11}, False),
                                 ("vocab 10^12", {"vocab_size": 10**12}, False),
                                 ("10^16 parameters", {"hidden_size": 2**20, "intermediate_size": 2**20,
                                                       "num_attention_heads": 2**10, "num_key_value_heads": 2**10,
                                                       "num_hidden_layers": 1000}, False),
                                 ("layers 2^70", {"num_hidden_layers": 2**70}, False),
                                 ("layers 10^4000", {"num_hidden_layers": 10**4000}, False),
                                 ("layers 1e308", {"num_hidden_layers": 1e308}, False)):
        data = json.dumps(_config(**change)) if change.get("num_hidden_layers") != 10**4000 else \
            json.dumps(TINY_CONFIG).replace('"num_hidden_layers": 1', '"num_hidden_layers": 1' + "0" * 4000)
        cases.append(Case(f"trace --hf-config {label}", ["trace", "--hf-config", "c.json", "-o", "o.json"],
                          {"c.json": data}, outputs=out, quick=quick))
    cases.append(Case("trace seq 10^12 of a config allowing it",
                      ["trace", "--hf-config", "c.json", "--seq", str(10**12), "--batch", str(10**5), "-o", "o.json"],
                      {"c.json": _config(max_position_embeddings=10**13)}, outputs=out))
    for seed, quick in (("-1", True), (str(2**64), False), (str(2**70), False), ("1e3", False)):
        cases.append(Case(f"trace --density-seed {seed}",
                          ["trace", "--hf-config", "c.json", "--density", "--density-seed", seed, "-o", "o.json"],
                          {"c.json": _config()}, outputs=out, quick=quick))
    cases.append(Case("trace without torch", ["trace", "gpt2", "-o", "o.json"], outputs=out, prelude=NO_TORCH,
                      quick=True))
    cases.append(Case("trace --list without torch", ["trace", "--list"], prelude=NO_TORCH))
    cases.append(Case("train without torch", ["train", "gpt2", "--planner", "lms", "--budget", "80%"],
                      prelude=NO_TORCH))
    # these run torch for real (seconds each)
    cases.append(Case("trace --hf-config with a byte-order mark",
                      ["trace", "--hf-config", "c.json", "--seq", "16", "-o", "o.json"],
                      {"c.json": BOM + json.dumps(_config()).encode()}, outputs=out, slow=True))
    cases.append(Case("trace --density --density-seed 2^64-1",
                      ["trace", "tiny:build", "--density", "--density-seed", str(2**64 - 1), "--density-out",
                       "d.json", "-o", "o.json"], {"tiny.py": TINY_MODEL}, outputs=("o.json", "d.json"), slow=True))
    cases.append(Case("trace --density-file of unknown ids",
                      ["trace", "tiny:build", "--density-file", "d.json", "-o", "o.json"],
                      {"tiny.py": TINY_MODEL, "d.json": {"nope": 0.5}}, outputs=out, slow=True))
    cases.append(Case("train small", ["train", "runtime.small_models:mlp", "--batch", "64", "--planner", "lms",
                                      "--budget", "80%"], slow=True))
    cases.append(Case("train --plan of another profile", ["train", "runtime.small_models:mlp", "--batch", "64",
                                                          "--plan", "plan.json"], {"plan.json": _plan()}, slow=True))
    return cases


def command_cases() -> list[Case]:
    """``place``, ``variants``, ``compare``, ``replay`` and every plan kind (issue 33)."""
    feats = feature_files()
    cases = []
    for plan in FEATURE_PLANS + ("group",):
        profile = "p.json" if plan == "group" else "m.json"
        files = {**feats, "p.json": _profile()}
        cases.append(Case(f"simulate {plan} plan", ["simulate", profile, f"{plan}.json", "--json"], files,
                          quick=plan in ("uvm", "codec", "cpu")))
        cases.append(Case(f"validate {plan} plan", ["validate", profile, f"{plan}.json"], files))
        cases.append(Case(f"place {plan} plan", ["place", profile, f"{plan}.json", "-o", "out.json"], files,
                          outputs=("out.json",), quick=plan == "cpu"))
        # --time-scale 20: m.json's 1 ms iteration in some 20 ms of real time (under 10 ms is refused)
        cases.append(Case(f"replay {plan} plan", ["replay", profile, f"{plan}.json", "--time-scale", "20"], files,
                          quick=plan == "uvm"))
    cases.append(Case("place -o over its plan", ["place", "m.json", "lms.json", "-o", "lms.json"], feats,
                      outputs=("lms.json",), quick=True))
    cases.append(Case("place --method first-fit --budget 1", ["place", "m.json", "lms.json", "--method",
                                                              "first-fit", "--budget", "1", "-o", "out.json"],
                      feats, outputs=("out.json",)))
    cases.append(Case("place fifo plan", ["place", "m.json", "f.json", "-o", "out.json"], feats,
                      special={"f.json": "fifo"}, outputs=("out.json",)))
    # variants
    good = feats["v.csv"]
    for label, content, quick in (("ok", good, False), ("byte-order mark and CRLF", BOM + good.replace("\n", "\r\n")
                                                                    .encode(), True),
                                  ("field past the csv limit", good + "o1,\"" + "x" * 200_000 + "\",1,1\n", False),
                                  ("carriage return in a field", good + "o1,a\rb,1,1\n", False),
                                  ("unclosed quote", good + "o1,\"abc", False),
                                  ("NUL bytes", good + "o1,\x00,1,1\n", False),
                                  ("not UTF-8", b"op,name\xff,time_us,workspace_bytes\n", False),
                                  ("huge numbers", good + "o1,big,1e400,99999999999999999999999\n", False),
                                  ("empty", "", False), ("header only", "op,name,time_us,workspace_bytes\n", False),
                                  ("unknown op", "op,name,time_us,workspace_bytes\nnope,a,1,1\n", False),
                                  ("'default'", good + f"{_first_op(feats)},default,1,1\n", False)):
        cases.append(Case(f"variants csv {label}", ["variants", "m.json", "--from", "v.csv", "-o", "out.json"],
                          {**feats, "v.csv": content}, outputs=("out.json",), quick=quick))
    for label, special in (("fifo", {"v.csv": "fifo"}), ("folder", {"v.csv": "dir"})):
        cases.append(Case(f"variants csv {label}", ["variants", "m.json", "--from", "v.csv", "-o", "out.json"],
                          feats, special=special, outputs=("out.json",), quick=label == "fifo"))
    cases.append(Case("variants csv /dev/zero", ["variants", "m.json", "--from", "/dev/zero", "-o", "out.json"],
                      feats, outputs=("out.json",)))
    cases.append(Case("variants -o over its csv", ["variants", "m.json", "--from", "v.csv", "-o", "v.csv"], feats,
                      outputs=("v.csv",)))
    # compare
    cases.append(Case("compare", ["compare", "m.json", "--planners", "lms,uvm", "--budgets", "90%", "--jobs", "1",
                                  "--out", "cmp"], feats, outputs=("cmp/",), quick=True))
    cases.append(Case("compare bad budgets", ["compare", "m.json", "--budgets", "1e400GiB,-5%", "--out", "cmp"],
                      feats, outputs=("cmp/",)))
    cases.append(Case("compare --out a file", ["compare", "m.json", "--planners", "lms", "--budgets", "90%",
                                               "--out", "m.json"], feats, outputs=("m.json",)))
    cases.append(Case("compare unknown planner", ["compare", "m.json", "--planners", "nope", "--out", "cmp"],
                      feats, outputs=("cmp/",)))
    cases += shared_folder_cases(feats)
    return cases


def shared_folder_cases(feats: dict) -> list[Case]:
    """Issue 49: runs into one ``compare --out`` folder keep every row, in sequence and at
    the same time; a set-up error under a file is one line."""
    def compare(planners: str, budgets: str = "90%,70%") -> list[str]:
        return ["compare", "m.json", "--planners", planners, "--budgets", budgets, "--jobs", "1", "--out", "cmp"]

    return [
        Case("compare into a shared folder", compare("uvm"), feats, outputs=("cmp/",), setup=[compare("lms")],
             rows=("cmp/results.json", 4), quick=True),
        Case("compare into a shared folder, other budgets", compare("lms", "50%"), feats, outputs=("cmp/",),
             setup=[compare("lms")], rows=("cmp/results.json", 3)),
        Case("compares at the same time", compare("lms"), feats, outputs=("cmp/",), also=[compare("uvm")],
             rows=("cmp/results.json", 4), quick=True),
        Case("three compares at the same time", compare("lms"), feats, outputs=("cmp/",),
             also=[compare("uvm"), compare("lms,uvm", "50%")], rows=("cmp/results.json", 6)),
        Case("compare --out under a file", ["compare", "m.json", "--planners", "lms", "--budgets", "90%", "--out",
                                            "m.json/x"], feats, quick=True),
    ]


def _first_op(feats: dict) -> str:
    return feats["v.csv"].splitlines()[1].split(",")[0]


# Bad sections of a hardware file, each run with the plan that uses it.
HARDWARE_SECTIONS = {
    "uvm": [{"block": 1}, {"block": "1B", "page": "1B", "big_page": "1B"}, {"page": "3KiB"},
            {"big_page": "1MiB", "page": "3MiB"}, {"fault_batch_faults": 0}, {"prefetch_threshold": 101},
            {"fault_latency_us": 1e308}, {"backing": "ssd"}, {"backing": "ssd", "host_cache": "10000PiB"},
            {"backing": "tape"}, {"fault_batch_blocks": 4, "page": "4KiB"}, {"caching_allocator": "yes"},
            {"block": "1e400GiB"}, [], "uvm"],
    "codecs": [{"zvc-dma": {"format": "nope", "where": "dma"}}, {"zvc-dma": {"format": "zvc", "where": "compute"}},
               {"zvc-dma": {"format": "zvc", "where": "dma", "encode_gbps": 5e-324}},
               {"zvc-dma": {"format": "zvc", "where": "compute", "encode_gbps": 5e-324, "decode_gbps": 5e-324}},
               {"zvc-dma": None}, {"": {"format": "zvc", "where": "dma"}}, {}, [], "zvc"],
    "cpu": [{"model": "x", "tflops": 0, "mem_gbps": 1, "launch_us": 1},
            {"model": "x", "tflops": 5e-324, "mem_gbps": 5e-324, "launch_us": 0},
            {"model": "x", "tflops": 1, "mem_gbps": 1, "launch_us": 1e308},
            {"model": "x", "tflops": -1, "mem_gbps": 1, "launch_us": 1}, {"tflops": 1}, None, [], "cpu"],
}
SECTION_PLAN = {"uvm": "uvm", "codecs": "codec", "cpu": "cpu"}


def hardware_cases() -> list[Case]:
    """Bad ``uvm``, ``codecs`` and ``cpu`` sections of a hardware file, with the plan kinds that use them."""
    feats = feature_files()
    cases = []
    for section, values in HARDWARE_SECTIONS.items():
        for k, value in enumerate(values):
            hardware = _hardware()
            hardware[section] = value
            files = {**feats, "hw.yaml": yaml.safe_dump(hardware)}
            plan = SECTION_PLAN[section]
            command = "place" if k % 3 == 2 else "simulate"
            args = [command, "m.json", f"{plan}.json", "--hardware", "hw.yaml"]
            args += ["-o", "out.json"] if command == "place" else []
            cases.append(Case(f"hardware {section}={json.dumps(value)[:60]} {command}", args, files,
                              outputs=("out.json",), quick=k == 0))
    return cases


def _long_profile(ops: int) -> str:
    tensors = ",".join(f'{{"bytes":100,"id":"t{k}","kind":"activation"}}' for k in range(ops))
    body = ",".join(f'{{"id":"o{k}","inputs":[{f"{chr(34)}t{k - 1}{chr(34)}" if k else ""}],"name":"k",'
                    f'"outputs":["t{k}"],"phase":"forward","time_us":1.5}}' for k in range(ops))
    return f'{{"format":"swapplan-profile/1","name":"long","source":{{}},"tensors":[{tensors}],"ops":[{body}]}}'


def fixed_cases(full: bool = False, slow: bool = False, quick: bool = False) -> list[Case]:
    """Every fixed case (``slow``: also those that run torch; ``quick``: only those marked quick)."""
    cases = hostile_cases(full) + trace_cases() + command_cases() + hardware_cases()
    cases = [c for c in cases if slow or not c.slow]
    return [c for c in cases if c.quick] if quick else cases


# ----------------------------------------------------------------------------- random cases


def _mutate(tree, rng: random.Random):
    """Replace, drop or duplicate one node of a parsed document."""
    tree = copy.deepcopy(tree)
    paths = node_paths(tree)
    path = rng.choice(paths[1:])
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    how = rng.random()
    if how < 0.7:
        parent[path[-1]] = rng.choice(EXTREME)
    elif how < 0.85 and isinstance(parent, dict):
        del parent[path[-1]]
    elif isinstance(parent, list):
        parent.append(copy.deepcopy(parent[path[-1]]))
    return tree


def _mutate_text(text: str, rng: random.Random) -> bytes:
    """A CSV with one line, cell or byte changed, or a byte-order mark added."""
    lines = text.splitlines()
    how = rng.random()
    if how < 0.15:
        return BOM + text.encode()
    if how < 0.3:
        data = bytearray(text.encode())
        data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    k = rng.randrange(len(lines))
    cells = lines[k].split(",")
    value = rng.choice(EXTREME)
    cells[rng.randrange(len(cells))] = value if isinstance(value, str) else json.dumps(value)
    if rng.random() < 0.3:
        cells.append("extra")
    lines[k] = ",".join(cells)
    return "\n".join(lines).encode("utf-8", "surrogatepass")


RANDOM_KINDS = ("profile", "profile-yaml", "hardware", "plan", "budget", "output", "feature-plan",
                "feature-hardware", "csv", "command")
SLOW_KINDS = ("hf-config",)


def random_case(rng: random.Random, k: int, slow: bool = False) -> Case:
    """A mutated profile, hardware file, plan (of any kind), variants CSV, transformers
    config (``slow``), or a mutated command line."""
    what = rng.choice(RANDOM_KINDS + (SLOW_KINDS if slow else ()))
    files = {"p.json": _profile(), "plan.json": _plan(), "hw.yaml": yaml.safe_dump(_hardware())}
    if what == "profile":
        files["p.json"] = json.dumps(_mutate(_profile(), rng))
        args = [rng.choice(["validate", "info", "simulate"]), "p.json"]
    elif what == "profile-yaml":
        files["p.yaml"] = yaml.safe_dump(_mutate(_profile(), rng), allow_unicode=True)
        args = [rng.choice(["validate", "info", "simulate"]), "p.yaml"]
    elif what == "hardware":
        files["hw.yaml"] = yaml.safe_dump(_mutate(_hardware(), rng), allow_unicode=True)
        args = ["simulate", "p.json", "plan.json", "--hardware", "hw.yaml", "--budget", "1GiB"]
    elif what == "plan":
        files["plan.json"] = json.dumps(_mutate(_plan(), rng))
        args = [rng.choice(["validate", "simulate"]), "p.json", "plan.json"]
    elif what == "budget":
        args = ["simulate", "p.json", "--budget", rng.choice(BUDGETS + [str(v) for v in EXTREME[:16]])]
    elif what == "feature-plan":
        files.update(feature_files())
        plan = rng.choice(FEATURE_PLANS + ("group",))
        profile = "p.json" if plan == "group" else "m.json"
        files[f"{plan}.json"] = json.dumps(_mutate(json.loads(files[f"{plan}.json"])
                                                   if isinstance(files[f"{plan}.json"], str)
                                                   else files[f"{plan}.json"], rng))
        command = rng.choice(["validate", "simulate", "simulate", "place", "replay"])
        args = [command, profile, f"{plan}.json"]
        if command == "place":
            return Case(f"random {k} {what} {plan} place", args + ["-o", "out.json"], files, outputs=("out.json",))
        if command == "replay":
            args += ["--time-scale", "20"]
    elif what == "feature-hardware":
        files.update(feature_files())
        section = rng.choice(sorted(SECTION_PLAN))
        hardware = _hardware()
        hardware[section] = _mutate({"s": hardware.get(section) or {"tflops": 1}}, rng).get("s")
        files["hw.yaml"] = yaml.safe_dump(hardware, allow_unicode=True)
        args = [rng.choice(["simulate", "validate"]), "m.json", f"{SECTION_PLAN[section]}.json", "--hardware",
                "hw.yaml"]
    elif what == "csv":
        files.update(feature_files())
        files["v.csv"] = _mutate_text(files["v.csv"], rng)
        return Case(f"random {k} csv", ["variants", "m.json", "--from", "v.csv", "-o", "out.json"], files,
                    outputs=("out.json",))
    elif what == "command":
        files.update(feature_files())
        args = rng.choice([
            ["place", "m.json", "lms.json", "--method", rng.choice(["smartpool", "greedy-size", "first-fit", "x"]),
             "--budget", rng.choice(BUDGETS), "-o", "out.json"],
            ["simulate", "m.json", rng.choice(FEATURE_PLANS) + ".json", "--budget", rng.choice(BUDGETS)],
            ["plan", "m.json", "--planner", rng.choice(["lms", "uvm", "cdma", "modnn", "zero-offload", "gist"]),
             "--budget", rng.choice(BUDGETS), "-o", "out.json"],
            ["trace", "--hf-config", "c.json", "--density", "--density-seed", str(rng.choice(EXTREME[:9])),
             "-o", "out.json"],
        ])
        files["c.json"] = _config(num_hidden_layers=10**9)   # refused before any trace
        return Case(f"random {k} command {args[0]}", args, files, outputs=("out.json",))
    elif what == "hf-config":
        files["c.json"] = json.dumps(_mutate(_config(), rng))
        return Case(f"random {k} hf-config", ["trace", "--hf-config", "c.json", "--seq", "16", "-o", "out.json"],
                    files, outputs=("out.json",))
    else:
        args = ["simulate", "p.json", "plan.json", "--budget", "1GiB", rng.choice(["--timeline", "--plot"]), "o.json"]
        special = rng.choice([{}, {"o.json": "fifo"}, {"o.json": "dir"}, {"o.json": "link:plan.json"}])
        return Case(f"random {k} output {special}", args, files, outputs=("o.json",) if not special else (),
                    special=special)
    return Case(f"random {k} {what}", args, files)


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120, help="how long to run the random cases")
    parser.add_argument("--cases", type=int, default=None, help="at most this many random cases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--full", action="store_true", help="build the hostile inputs at full size (and --slow)")
    parser.add_argument("--slow", action="store_true", help="also the cases that trace or train with torch")
    parser.add_argument("--quick", action="store_true", help="only the fixed cases marked quick (CI)")
    parser.add_argument("--jobs", type=int, default=1, help="cases run at once")
    parser.add_argument("--timeout", type=float, default=60, help="seconds one case may take")
    parser.add_argument("--memory", default=3 << 30, type=int, help="bytes of memory one case may use")
    parser.add_argument("--keep", default="fuzz-failures", help="folder for failing cases")
    args = parser.parse_args(argv)
    slow = args.slow or args.full
    rng = random.Random(args.seed)
    lock = threading.Lock()
    failures: list[str] = []

    def check(case: Case) -> None:
        problem = run_case(case, args.timeout, args.memory)
        if problem is None:
            return
        with lock:
            failures.append(case.name)
            print(f"FAIL {case.name}: {case.command()}\n     {problem}", flush=True)
            keep = Path(args.keep) / f"case-{args.seed}-{len(failures)}"
        shutil.rmtree(keep, ignore_errors=True)
        keep.mkdir(parents=True)
        case.build(keep)
        (keep / "COMMAND").write_text(case.command() + "\n")

    fixed = fixed_cases(args.full, slow, args.quick)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        list(pool.map(check, fixed))
    print(f"fixed cases: {len(fixed)} run, {len(failures)} failed", flush=True)

    randoms: list[Case] = []
    deadline = time.monotonic() + args.seconds
    k = 0

    def next_case() -> Case | None:
        nonlocal k
        while (args.cases is None or k < args.cases) and time.monotonic() < deadline:
            try:
                return random_case(rng, k, slow)
            except (yaml.YAMLError, ValueError, UnicodeError, TypeError):   # a mutation the writers cannot write
                continue
            finally:
                k += 1
        return None

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        running = []
        while True:
            case = next_case()
            if case is None:
                break
            randoms.append(case)
            running.append(pool.submit(check, case))
            while len([f for f in running if not f.done()]) >= max(1, args.jobs):
                time.sleep(0.05)
        for future in running:
            future.result()
    print(f"random cases: {len(randoms)} run; failures in all: {len(failures)}"
          + (f" (kept in {args.keep}/)" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
