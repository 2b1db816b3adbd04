"""A profile file: load (``.json``, ``.json.gz``, ``.yaml``) and save, atomically, in the
saved form (canonical entries, one tensor or op per line)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from ..errors import InputError
from ..files import YAML_SHARE, gzip_bytes, max_input_bytes, read_document, write_atomic
from .facts import Profile
from .parse import profile_from_document
from .records import FORMAT


def load_profile(path: str | Path) -> Profile:
    """Load and validate a profile from ``.json``, ``.json.gz`` or ``.yaml``.

    Raises InputError naming the file, field and problem.
    """
    return profile_from_document(read_document(path), str(path), consume=True)


def profile_bytes(profile: Profile) -> bytes:
    """The saved JSON text: canonical entries, one tensor or op per line (diff-friendly)."""
    data = profile.to_dict()

    def line(value) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    head = (f'{{"format":{line(FORMAT)},"name":{line(data["name"])},'
            f'"source":{line(data["source"])},\n')
    tensors = ",\n".join(line(t) for t in data["tensors"])
    ops = ",\n".join(line(o) for o in data["ops"])
    return f'{head}"tensors":[\n{tensors}\n],\n"ops":[\n{ops}\n]}}\n'.encode("utf-8")


def save_profile(profile: Profile, path: str | Path) -> None:
    """Save as JSON (``.json``), gzipped JSON (``.json.gz``, reproducible) or YAML (``.yaml``).

    The write is atomic. Raises InputError if the file cannot be written, or for YAML
    larger than a YAML file may be read (``files.YAML_SHARE``).
    """
    lower = str(path).lower()
    if lower.endswith((".yaml", ".yml")):
        payload = yaml.safe_dump(profile.to_dict(), sort_keys=True).encode("utf-8")
        limit = max_input_bytes() // YAML_SHARE
        if len(payload) > limit:  # it could not be read back: YAML is for hand-written files
            raise InputError(str(path), "", f"as YAML this profile is {len(payload)} bytes, more than a YAML "
                                            f"file may be ({limit}); write .json or .json.gz")
    elif lower.endswith(".gz"):
        payload = gzip_bytes(profile_bytes(profile))
    else:
        payload = profile_bytes(profile)
    write_atomic(path, payload)
