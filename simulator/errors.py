"""The one family of exceptions swapplan raises on purpose.

Callers catch ``SwapplanError`` for everything, or a subclass precisely. The CLI
turns ``InputError`` into one line ``error: <file>: <where>: <problem>`` and exit 2.
"""
from __future__ import annotations


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
        """The one-line form: ``<file>: <where>: <problem>``."""
        parts = [p for p in (self.file, self.where) if p]
        return ": ".join(parts + [self.problem])


class InfeasibleError(SwapplanError):
    """A request that cannot be met, such as a budget below the feasible floor."""


class SolverError(SwapplanError):
    """A solver failed or is unavailable."""
