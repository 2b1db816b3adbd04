"""Regenerate the shipped profiles: ``python -m tracer.make_profiles [--only KIND] [--check]``.

Three kinds ship in ``profiles/``:

- synthetic (``.json``): three generated graphs, timed on a100-40gb-pcie4;
- traced (``.json.gz``): real models traced on fake tensors (needs the ``trace`` extra),
  timed on a100-40gb-pcie4, at batch sizes that put their no-swap peak at about 2x the
  40 GiB GPU, the regime where swapping matters (the CNNs and GPT-2 with tensor densities
  measured on a real CPU step at a small batch, ``DENSITY_SIZES``); and two mixed-precision LLMs traced
  from the shipped transformers configs (``tracer/configs``) for offloading planners:
  Llama-2 13B in fp16 on a 32 GB V100 (ZeRO-Offload's setup) and Llama-2 70B in bf16 on
  the H200 with 1.5 TB of host memory, 16 bytes per parameter with AdamW;
- imported (``.json.gz``): the VGG13 training iteration measured on an H100 (the trace
  beside this checkout in ../shared/data; skipped when that folder is absent).

Each is rebuilt and written (or, with ``--check``, compared byte for byte with the
shipped file; exit status 1 if any is missing or differs). Same inputs, same bytes.
"""
from __future__ import annotations

import argparse
import gzip
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from simulator.catalog import profile_dir
from simulator.profile import Profile, profile_bytes, save_profile
from tracer.synthetic import synthesize

# The synthetic profiles' parameters, and the names synthesize gives them (a test checks).
SYNTHETIC_NAMES = ("synth-mlp-l16-w8192-b1024", "synth-cnn-l16-w128-b64-s224", "synth-transformer-l12-b16-s1024")
SYNTHETIC = (
    {"model": "mlp", "layers": 16, "width": 8192, "batch": 1024},
    {"model": "cnn", "layers": 16, "width": 128, "batch": 64, "seq": 224},
    {"model": "transformer", "layers": 12, "batch": 16, "seq": 1024},
)

# Traced models (model, batch, seq): peaks of 1.8x-2.2x a 40 GiB GPU in fp32 with AdamW.
TRACED = (
    ("gpt2", 48, 1024), ("gpt2-medium", 24, 1024), ("bert-base", 160, 512), ("bert-large", 80, 512),
    ("llama-1b", 12, 2048), ("vit-base", 640, 224), ("resnet50", 1024, 224), ("resnet152", 512, 224),
    ("vgg16", 1024, 224),
)

# Traced models shipped with measured densities (``trace(..., density=True)``, tracer.density):
# the batch and sequence length (None: the traced image side) of the real CPU step that
# measures them. GPT-2's graph at batch 1 differs from the full one (a contiguous slice
# copies nothing), so 2; at its full sequence, not --density's default 128 tokens.
DENSITY_SIZES = {"resnet50": (4, None), "resnet152": (4, None), "vgg16": (2, None), "gpt2": (2, 1024)}

# Mixed-precision LLMs (name, config in tracer/configs, batch, seq, amp, hardware): one
# sequence of 1024 tokens per step, as ZeRO-Offload trains a 13B model on one V100 32GB.
AMP_TRACED = (
    ("llama2-13b-b1-s1024-amp-fp16", "llama2-13b", 1, 1024, "fp16", "v100-32gb-pcie3"),
    ("llama2-70b-b1-s1024-amp-bf16", "llama2-70b", 1, 1024, "bf16", "h200-141gb-1.5tb-pcie5"),
)

VGG13_TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "triosim-vgg13-h100"
VGG13_NAME = "vgg13-b512-h100-measured"


@dataclass(frozen=True)
class Recipe:
    """How one shipped profile is made."""
    name: str
    kind: str                         # synthetic | traced | imported
    suffix: str                       # .json | .json.gz
    build: Callable[[], Profile]
    available: Callable[[], str | None] = lambda: None   # why it cannot be built here, or None


def _traced(model: str, batch: int, seq: int) -> Profile:
    from tracer.pytorch.trace import trace
    if model in DENSITY_SIZES:
        density_batch, density_seq = DENSITY_SIZES[model]
        return trace(model, batch=batch, seq=seq, density=True, density_batch=density_batch,
                     density_seq=density_seq)
    return trace(model, batch=batch, seq=seq)


def _amp_traced(name: str, config: str, batch: int, seq: int, amp: str, hardware: str) -> Profile:
    from tracer.models import CONFIG_DIR
    from tracer.pytorch.trace import trace
    return trace(hf_config=CONFIG_DIR / f"{config}.json", batch=batch, seq=seq, amp=amp,
                 hardware=hardware, name=name)


def _torch_missing() -> str | None:
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed (pip install '.[trace]')"
    return None


def _vgg13() -> Profile:
    from tracer.kineto import import_kineto
    return import_kineto(VGG13_TRACE / "kineto_trace.json", et_path=VGG13_TRACE / "execution_trace.json",
                         name=VGG13_NAME)


def recipes() -> list[Recipe]:
    """Every shipped profile, synthetic first."""
    found = [Recipe(name, "synthetic", ".json", lambda p=p: synthesize(**p))
             for name, p in zip(SYNTHETIC_NAMES, SYNTHETIC)]
    found += [Recipe(f"{m}-b{b}-s{s}", "traced", ".json.gz", lambda m=m, b=b, s=s: _traced(m, b, s),
                     _torch_missing) for m, b, s in TRACED]
    found += [Recipe(row[0], "traced", ".json.gz", lambda row=row: _amp_traced(*row), _torch_missing)
              for row in AMP_TRACED]
    found.append(Recipe(VGG13_NAME, "imported", ".json.gz", _vgg13,
                        lambda: None if VGG13_TRACE.is_dir() else f"{VGG13_TRACE} is absent"))
    return found


def synthetic_profiles() -> list[Profile]:
    """The synthetic shipped profiles, built in memory."""
    return [synthesize(**params) for params in SYNTHETIC]


def shipped_path(name: str, suffix: str, folder: Path | None = None) -> Path:
    """Where a shipped profile lives: ``<folder>/<name><suffix>``."""
    return (folder or profile_dir()) / f"{name}{suffix}"


def summary(profile: Profile) -> str:
    """One line: name, ops, tensors, no-swap peak in GiB, ideal time in ms."""
    return (f"{profile.name}: {len(profile.ops)} ops, {len(profile.tensors)} tensors, "
            f"peak {profile.peak_bytes / 2**30:.2f} GiB, ideal {profile.ideal_us / 1e3:.1f} ms")


def differs(profile: Profile, path: Path) -> bool:
    """True when ``path`` is missing or does not hold exactly this profile's saved bytes."""
    if not path.is_file():
        return True
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    return data != profile_bytes(profile)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracer.make_profiles", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="compare with the shipped files instead of writing them")
    parser.add_argument("--only", choices=("synthetic", "traced", "imported"), default=None,
                        help="only this kind of profile")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder to write to or check (default: the profiles package)")
    args = parser.parse_args(argv)
    stale = 0
    for recipe in recipes():
        if args.only and recipe.kind != args.only:
            continue
        missing = recipe.available()
        if missing:
            print(f"{recipe.name}: skipped ({missing})")
            continue
        profile = recipe.build()
        path = shipped_path(recipe.name, recipe.suffix, args.out)
        if args.check:
            bad = differs(profile, path)
            stale += bad
            print(f"{summary(profile)}  [{'DIFFERS' if bad else 'ok'}]", flush=True)
        else:
            save_profile(profile, path)
            print(summary(profile), flush=True)
    if stale:
        print(f"{stale} shipped profile(s) differ; run python -m tracer.make_profiles", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
