"""Regenerate the shipped synthetic profiles: ``python -m tracer.make_profiles [--check]``.

Writes ``profiles/<name>.json`` for each entry of SHIPPED (timed on the default
preset, a100-40gb-pcie4) and prints one line per profile. With ``--check`` nothing
is written: each profile is rebuilt in memory and compared byte for byte with the
shipped file; the exit status is 1 if any file is missing or differs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simulator.catalog import profile_dir
from simulator.profile import Profile, profile_bytes, save_profile
from tracer.synthetic import synthesize

# The parameters of the shipped profiles; the names follow from them:
# synth-mlp-l16-w8192-b1024, synth-cnn-l16-w128-b64-s224, synth-transformer-l12-b16-s1024.
SHIPPED = (
    {"model": "mlp", "layers": 16, "width": 8192, "batch": 1024},
    {"model": "cnn", "layers": 16, "width": 128, "batch": 64, "seq": 224},
    {"model": "transformer", "layers": 12, "batch": 16, "seq": 1024},
)


def shipped_profiles() -> list[Profile]:
    """Build every shipped profile in memory."""
    return [synthesize(**params) for params in SHIPPED]


def shipped_path(profile: Profile, folder: Path | None = None) -> Path:
    """Where a shipped profile is saved: ``<folder>/<name>.json``."""
    return (folder or profile_dir()) / f"{profile.name}.json"


def summary(profile: Profile) -> str:
    """One line: name, ops, tensors, no-swap peak in GiB, ideal time in ms."""
    return (f"{profile.name}: {len(profile.ops)} ops, {len(profile.tensors)} tensors, "
            f"peak {profile.peak_bytes / 2**30:.2f} GiB, ideal {profile.ideal_us / 1e3:.1f} ms")


def differs(profile: Profile, path: Path) -> bool:
    """True when ``path`` is missing or does not hold exactly this profile's saved bytes."""
    return not path.is_file() or path.read_bytes() != profile_bytes(profile)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracer.make_profiles", description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="compare with the shipped files instead of writing them")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder to write to or check (default: the profiles package)")
    args = parser.parse_args(argv)
    stale = 0
    for profile in shipped_profiles():
        path = shipped_path(profile, args.out)
        if args.check:
            bad = differs(profile, path)
            stale += bad
            print(f"{summary(profile)}  [{'DIFFERS' if bad else 'ok'}]")
        else:
            save_profile(profile, path)
            print(summary(profile))
    if stale:
        print(f"{stale} shipped profile(s) differ; run python -m tracer.make_profiles",
              file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
