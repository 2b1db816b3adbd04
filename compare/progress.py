"""The progress line on stderr: cells done of all, the last cell, and the time left."""
from __future__ import annotations

import sys
import time


class ProgressLine:
    """Redrawn in place on a terminal; one line per finished cell otherwise."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self.first_done: int | None = None

    def __call__(self, done: int, total: int, row: dict) -> None:
        if self.first_done is None:   # cells resumed from an earlier run do not count for the ETA
            self.first_done, self.started = done, time.monotonic()
            if not row:
                if done and not self.tty:
                    self.stream.write(f"[{done}/{total}] already done, resuming\n")
                return
        ran = done - self.first_done
        elapsed = time.monotonic() - self.started
        eta = elapsed / ran * (total - done) if ran else 0.0
        what = (f"{row['profile']} {row['hardware']} {row['planner']} {row['budget']}: {row['status']}"
                if row else "")
        line = f"[{done}/{total}] {100 * done / max(total, 1):3.0f}%  eta {_clock(eta)}  {what}"
        if self.tty:
            self.stream.write("\r\033[K" + line[:max(20, 150)])
            if done == total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
