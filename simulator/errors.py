"""The one family of exceptions swapplan raises on purpose.

Callers catch ``SwapplanError`` for everything, or a subclass precisely. The CLI
turns ``InputError`` into one line ``error: <file>: <where>: <problem>`` and exit 2.
"""
from __future__ import annotations

import re

# A value echoed into a message (an id, a number, a path) is cut to its start and end
# past this many characters, and a whole line past LINE_LIMIT: errors stay one short line.
TOKEN_LIMIT = 100
LINE_LIMIT = 1000
_LONG_TOKEN = re.compile(r"\S{%d,}" % (TOKEN_LIMIT + 1))


def shorten(text: str) -> str:
    """``text`` with every run of more than 100 non-space characters cut to its first 60
    and last 20 characters (``...`` between, with the length), and the whole cut at 1,000.

    ``unknown tensor 'xxxx...(1000002 characters)...xxxx'`` for a 1 MB id.
    """
    text = _LONG_TOKEN.sub(lambda m: f"{m[0][:60]}...({len(m[0])} characters)...{m[0][-20:]}", text)
    if len(text) > LINE_LIMIT:
        text = text[: LINE_LIMIT - 30] + f"...({len(text)} characters)"
    return text


class SwapplanError(Exception):
    """Base class of every error swapplan raises deliberately."""


class InputError(SwapplanError):
    """Bad input: a malformed file, an unknown id, a bad value.

    Parameters
    ----------
    file : str
        The file (or ``"<argument>"`` / ``"<profile>"`` for in-memory data).
    where : str
        The field or element, e.g. ``"ops[3] (o3).inputs"``.
    problem : str
        What is wrong, in a few words.
    """

    def __init__(self, file: str, where: str, problem: str):
        self.file = str(file)
        self.where = where
        self.problem = problem
        super().__init__(self.line())

    def line(self) -> str:
        """The one-line form: ``<file>: <where>: <problem>``, long values shortened."""
        parts = [p for p in (self.file, self.where) if p]
        return shorten(": ".join(parts + [self.problem]))


class InfeasibleError(SwapplanError):
    """A request that cannot be met, such as a budget below the feasible floor
    (``floor_bytes``: that floor, ``op``: the op that sets it, where known)."""

    def __init__(self, message: str = "", floor_bytes: int | None = None, op: str | None = None):
        super().__init__(message)
        self.floor_bytes = floor_bytes
        self.op = op


class SolverError(SwapplanError):
    """A solver failed or is unavailable."""
