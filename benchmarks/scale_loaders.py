"""How the loaders scale: `swapplan validate` of large profiles and plans (issue 17).

Run: ``.venv/bin/python benchmarks/scale_loaders.py [--ops 1000000] [--rich]``.

Builds, in a temporary folder, a JSON profile of ``--ops`` ops in a chain (one tensor
each, no names: about 160 bytes an op), with ``--rich`` also a synthetic MLP of as many
ops (two tensors an op, with names, shapes and dtypes: about 420 bytes an op; slow to
build), a YAML profile of 10,000 ops, and a plan of 564,000 actions; then runs
``swapplan validate`` on each as its own process and prints the wall time and the peak
memory (maximum resident set). Not a timed test: the figures depend on the machine.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWAPPLAN = [sys.executable, "-c", "import cli; cli.main()"]


def chain_profile(path: Path, ops: int) -> None:
    with open(path, "w") as out:
        out.write('{"format":"swapplan-profile/1","name":"chain","source":{},\n"tensors":[\n')
        out.write(",\n".join(f'{{"bytes":{100 + k % 7},"id":"t{k}","kind":"activation"}}' for k in range(ops)))
        out.write('\n],\n"ops":[\n')
        out.write(",\n".join(
            f'{{"id":"o{k}","inputs":[{chr(34) + "t" + str(k - 1) + chr(34) if k else ""}],"name":"aten::mm",'
            f'"outputs":["t{k}"],"phase":"forward","time_us":1.5}}' for k in range(ops)))
        out.write("\n]}\n")


def chain_plan(path: Path, actions: int) -> None:
    """Offload/prefetch pairs on the chain profile (checked against the schema only)."""
    items = []
    for k in range(actions // 2):
        items.append({"kind": "offload", "tensor": f"t{k}", "to": "host", "after": f"o{k}"})
        items.append({"kind": "prefetch", "tensor": f"t{k}", "from": "host", "after": f"o{k}",
                      "before": f"o{k + 2}"})
    path.write_text(json.dumps({"format": "swapplan-plan/1", "profile": {"name": "chain"},
                                "actions": items}, indent=0))


# Runs swapplan in the process and reports that process's own peak memory last: VmHWM
# (Linux), which starts afresh at exec, unlike ru_maxrss (the parent's size at fork).
_MEASURED = ("import sys, cli\n"
             "try:\n    cli.main(sys.argv[1:])\nexcept SystemExit as exc:\n    code = exc.code\n"
             "hwm = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')]\n"
             "print(hwm[0] if hwm else 0, file=sys.stderr)\nsys.exit(code)\n")


def measure(label: str, *args: str) -> None:
    """Run one swapplan process; print its wall time and peak memory."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _MEASURED, *args], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    lines = done.stderr.strip().splitlines()
    peak_kb = int(lines[-1]) if lines and lines[-1].isdigit() else 0
    status = "ok" if done.returncode == 0 else f"exit {done.returncode}: {' '.join(lines[:-1])[:200]}"
    print(f"{label}: {seconds:.1f} s, peak {peak_kb / 2**20:.2f} GB; {status}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--rich", action="store_true", help="also the synthetic MLP of --ops ops")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        plan = folder / "plan.json"
        chain_plan(plan, 564_000)
        small = folder / "small.json"
        chain_profile(small, 564_002)
        measure("profile of 564,002 ops + plan of 564,000 actions: validate", "validate", str(small), str(plan))
        small.unlink()
        yaml_path = folder / "m10k.yaml"
        subprocess.run(SWAPPLAN + ["synth", "mlp", "--layers", "1666", "--width", "64", "--batch", "1",
                                   "-o", str(yaml_path)], cwd=ROOT, check=True, capture_output=True)
        measure(f"YAML profile of 10,002 ops ({yaml_path.stat().st_size / 1e6:.1f} MB): validate",
                "validate", str(yaml_path))
        chain = folder / "chain.json"
        chain_profile(chain, options.ops)
        measure(f"JSON profile of {options.ops:,} ops, {options.ops:,} tensors "
                f"({chain.stat().st_size / 1e6:.0f} MB): validate", "validate", str(chain))
        chain.unlink()
        if options.rich:
            rich = folder / "mlp.json"
            subprocess.run(SWAPPLAN + ["synth", "mlp", "--layers", str(max(1, (options.ops - 2) // 6)),
                                       "--width", "64", "--batch", "1", "-o", str(rich)],
                           cwd=ROOT, check=True, capture_output=True)
            measure(f"synthetic MLP profile of about {options.ops:,} ops, twice as many tensors "
                    f"({rich.stat().st_size / 1e6:.0f} MB): validate", "validate", str(rich))


if __name__ == "__main__":
    main()
