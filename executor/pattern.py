"""The integrity patterns: what every tensor holds, derived from its id and version.

A tensor's data is 64-bit words; word ``i`` of tensor ``t`` at version ``v`` (the count of
in-place updates it has had) is ``seed(t, v) + i * K`` (mod 2^64), with ``seed`` the first
8 bytes of BLAKE2b of ``t`` and ``v`` and ``K`` an odd constant. Word 0 is the seed
itself, so data that does not match can often be named: "a12 version 0" (a stale copy),
"w3 version 2" (another tensor's bytes), or "unrecognised data" (garbage, zeros, a
torn copy). A shifted copy fails too, since every word depends on its position.
"""
from __future__ import annotations

import os

import hashlib

import numpy as np

K = np.uint64(0x9E3779B97F4A7C15)   # odd: i -> i * K is a bijection mod 2^64


def seed_of(tensor: str, version: int) -> int:
    digest = hashlib.blake2b(f"{tensor}\x00{version}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class Patterns:
    """Fills and checks word arrays; remembers every (tensor, version) it made a seed for,
    so that a mismatch can say whose data was found instead."""

    def __init__(self, max_words: int):
        self.ramp = np.arange(max(1, max_words), dtype=np.uint64) * K
        self.known: dict[int, tuple[str, int]] = {}

    def seed(self, tensor: str, version: int) -> int:
        value = seed_of(tensor, version)
        self.known[value] = (tensor, version)
        return value

    def fill(self, words: np.ndarray, first: int, seed: int) -> None:
        """Write the pattern of ``seed`` into ``words``, which hold words ``first``... of
        the tensor."""
        np.add(self.ramp[first:first + len(words)], np.uint64(seed), out=words)

    def check(self, words: np.ndarray, first: int, seed: int) -> str | None:
        """None when ``words`` hold the pattern of ``seed`` from word ``first``; else what
        was found, in words."""
        expected = self.ramp[first:first + len(words)] + np.uint64(seed)
        if np.array_equal(words, expected):
            return None
        bad = int(np.argmin(words == expected))
        found_seed = (int(words[bad]) - int(self.ramp[first + bad])) % 2**64
        found = self.known.get(found_seed)
        what = f"{found[0]} version {found[1]}" if found else "unrecognised data"
        return f"{what} at byte {8 * (first + bad)}"


def check_lower_copy(patterns: "Patterns", host_data, fd: int, offset: int, nbytes: int, seed: int) -> str | None:
    """Check a tensor's copy in host memory (``host_data``, None when there is none) or,
    for ``host_data`` of False, on the SSD file ``fd`` at ``offset``: None if intact,
    else what is wrong. Both backends keep their lower tiers the same way."""
    if host_data is not False:
        if host_data is None:
            return "no host buffer"
        return patterns.check(host_data[:nbytes].view(np.uint64), 0, seed)
    data = np.empty(nbytes, dtype=np.uint8)
    got = os.preadv(fd, [data], offset)
    if got != nbytes:
        return f"a short SSD read ({got} of {nbytes} bytes)"
    return patterns.check(data.view(np.uint64), 0, seed)
