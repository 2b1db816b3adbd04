"""A compare cell's time limit is kept by every planner: with a tiny limit on a real
profile each cell ends by its hard limit (1.5x + 1 s), as a plan or recorded as a timeout,
and no planner swallows the cell's timeout (swapadvisor once caught it while running its
seed planners and came back "ok" minutes later)."""
from __future__ import annotations

import time

import pytest

from compare.cells import TIMEOUT, CellTimeout, hard_limit_s, run_cell
from compare.sweep import expand_cells
from planner.core.registry import planners

LIMIT = 0.2
PROFILE = "gpt2-b48-s1024"


@pytest.mark.parametrize("planner", [spec.name for spec in planners()])
def test_every_planner_ends_by_the_cells_hard_limit(planner):
    cell = expand_cells([PROFILE], ["a100-40gb-pcie4"], [planner], ["50%"], time_limit=LIMIT)[0]
    started = time.perf_counter()
    row, _ = run_cell(cell)
    took = time.perf_counter() - started
    hard = hard_limit_s(LIMIT)
    assert took <= hard + 1.5, (planner, row["status"], took)     # + loading the profile
    assert row["status"] == TIMEOUT or (row["planning_seconds"] or 0) <= hard + 0.5, (planner, row)


def test_the_cells_timeout_is_not_an_exception_a_planner_can_catch():
    assert not issubclass(CellTimeout, Exception) and issubclass(CellTimeout, BaseException)
    try:
        raise CellTimeout()
    except Exception:   # noqa: BLE001  (what a planner's fallback or a failed seed catches)
        pytest.fail("a planner's `except Exception` swallowed the cell's timeout")
    except CellTimeout:
        pass
