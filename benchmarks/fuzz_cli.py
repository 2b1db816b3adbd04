"""Fuzz the command line with careless and hostile input, for as long as you like.

Run: ``.venv/bin/python benchmarks/fuzz_cli.py --seconds 600 [--seed N] [--full]``.

Each case is a real ``swapplan`` process in a fresh folder, under a time limit and a
memory limit. A case fails when the process exits with anything but 0, 1 or 2 (3 is an
internal error), prints a traceback, prints more than one error line (or one over 400
characters), runs past the time limit (a hang) or the memory limit (a blow-up), or
changes anything in its folder but the output it was asked to write. Failures are
copied to ``--keep`` (default ``fuzz-failures/``) with the command, to reproduce.

The cases: the hostile inputs of issue 17 (``--full`` builds them at full size: a 1 GB
gzip bomb, a 9-level YAML alias bomb, a 600k-op profile), then random mutations of a
small valid profile, hardware file and plan (values swapped for extreme numbers, long
or odd strings, wrong types; keys dropped; files swapped for FIFOs, links, folders and
devices) and of the command line (budgets, --top, outputs).
"""
from __future__ import annotations

import argparse
import copy
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
import time
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


def _hardware() -> dict:
    return yaml.safe_load((preset_dir() / "a100-40gb-pcie4.yaml").read_text())


def _profile() -> dict:
    return profile_dict(TWO_LAYER_TENSORS, TWO_LAYER_OPS, "two-layer")


def _plan() -> dict:
    return two_layer_plan()


# ----------------------------------------------------------------------------- one case


class Case:
    """Files to write into a fresh folder and a command to run there."""

    def __init__(self, name: str, args: list[str], files: dict | None = None, outputs: tuple = (),
                 special: dict | None = None, env: dict | None = None):
        self.name, self.args, self.files = name, args, files or {}
        self.outputs, self.special, self.env = set(outputs), special or {}, env or {}

    def build(self, folder: Path) -> None:
        for name, content in self.files.items():
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


def run_case(case: Case, timeout: float, memory: int) -> str | None:
    """None when the case behaved, else what went wrong."""
    with tempfile.TemporaryDirectory(prefix="swapplan-fuzz-") as tmp:
        folder = Path(tmp)
        case.build(folder)
        before = _snapshot(folder)
        env = dict(os.environ, PYTHONPATH=str(ROOT), **case.env)
        start = time.monotonic()
        try:
            done = subprocess.run([sys.executable, "-c", "import cli; cli.main()", *case.args], cwd=folder,
                                  capture_output=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL,
                                  preexec_fn=_limit_memory(memory))
        except subprocess.TimeoutExpired:
            return f"hang: still running after {timeout:.0f} s"
        seconds = time.monotonic() - start
        err = done.stderr.decode("utf-8", "replace")
        problems = []
        if done.returncode not in (0, 1, 2):
            problems.append(f"exit {done.returncode}")
        debug = "--debug" in case.args  # the traceback is asked for; the last line is the error
        if ("Traceback" in err and not debug) or "MemoryError" in err:
            problems.append("traceback or MemoryError")
        errors = [line for line in err.splitlines() if not line.startswith(("note: ", "tracing "))]
        errors = errors[-1:] if debug else errors
        if done.returncode == 2 and (len(errors) != 1 or len(errors[0]) > 400):
            problems.append(f"{len(errors)} error lines, longest {max(map(len, errors), default=0)} characters")
        after = _snapshot(folder)
        changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)} - case.outputs
        if changed:
            problems.append(f"touched {sorted(changed)[:5]}")
        if problems:
            return "; ".join(problems) + f" ({seconds:.1f} s): {err.strip()[-300:]}"
    return None


# ----------------------------------------------------------------------------- the cases


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
                          {**base, "hw.yaml": yaml.safe_dump(hardware)}))
    for budget in BUDGETS:
        cases.append(Case(f"budget {budget[:20]}", ["simulate", "p.json", "--budget", budget], base))
    text = json.dumps(_profile()).replace('"a2"', '"\\ud800"')
    for command in (["validate"], ["info"], ["simulate"], ["plan", "--budget", "90%"]):
        cases.append(Case(f"surrogate {command[0]}", [command[0], "s.json", *command[1:]], {"s.json": text}))
    for levels in (7, 9):
        for command in ("validate", "info", "simulate"):
            cases.append(Case(f"alias bomb {levels} {command}", [command, "bomb.yaml"],
                              {"bomb.yaml": alias_bomb(levels)}))
    cases.append(Case("fifo profile", ["info", "f.json"], special={"f.json": "fifo"}))
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


def _long_profile(ops: int) -> str:
    tensors = ",".join(f'{{"bytes":100,"id":"t{k}","kind":"activation"}}' for k in range(ops))
    body = ",".join(f'{{"id":"o{k}","inputs":[{f"{chr(34)}t{k - 1}{chr(34)}" if k else ""}],"name":"k",'
                    f'"outputs":["t{k}"],"phase":"forward","time_us":1.5}}' for k in range(ops))
    return f'{{"format":"swapplan-profile/1","name":"long","source":{{}},"tensors":[{tensors}],"ops":[{body}]}}'


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


def random_case(rng: random.Random, k: int) -> Case:
    """A mutated profile, hardware file or plan, or a mutated command line."""
    what = rng.choice(["profile", "profile-yaml", "hardware", "plan", "budget", "output"])
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
    else:
        args = ["simulate", "p.json", "plan.json", "--budget", "1GiB", rng.choice(["--timeline", "--plot"]), "o.json"]
        special = rng.choice([{}, {"o.json": "fifo"}, {"o.json": "dir"}, {"o.json": "link:plan.json"}])
        return Case(f"random {k} output {special}", args, files, outputs=("o.json",) if not special else (),
                    special=special)
    return Case(f"random {k} {what}", args, files)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120, help="how long to run the random cases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--full", action="store_true", help="build the hostile inputs at full size")
    parser.add_argument("--timeout", type=float, default=60, help="seconds one case may take")
    parser.add_argument("--memory", default=3 << 30, type=int, help="bytes of memory one case may use")
    parser.add_argument("--keep", default="fuzz-failures", help="folder for failing cases")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    failures = 0
    ran = 0

    def check(case: Case) -> None:
        nonlocal failures, ran
        ran += 1
        problem = run_case(case, args.timeout, args.memory)
        if problem is None:
            return
        failures += 1
        print(f"FAIL {case.name}: swapplan {' '.join(a[:60] for a in case.args)}\n     {problem}", flush=True)
        keep = Path(args.keep) / f"case-{args.seed}-{failures}"
        shutil.rmtree(keep, ignore_errors=True)
        keep.mkdir(parents=True)
        case.build(keep)
        (keep / "COMMAND").write_text("swapplan " + " ".join(case.args) + "\n")

    for case in hostile_cases(args.full):
        check(case)
    print(f"hostile cases: {ran} run, {failures} failed", flush=True)
    deadline = time.monotonic() + args.seconds
    k = 0
    while time.monotonic() < deadline:
        try:
            case = random_case(rng, k)
        except (yaml.YAMLError, ValueError, UnicodeError):  # a mutation the writers cannot write
            continue
        finally:
            k += 1
        check(case)
    print(f"random cases: {k} run; failures in all: {failures}" + (f" (kept in {args.keep}/)" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
