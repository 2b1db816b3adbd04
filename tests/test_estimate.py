"""planner.core.estimate.MemoryEstimate on a hand-made graph whose numbers can be checked by hand."""
from __future__ import annotations

import numpy as np
import pytest

from planner.shared.estimate import MemoryEstimate
from tests.conftest import make_profile

# w: 10 B weight. f1: w -> a (100)   f2: a -> b (50)   f3: b -> c (20)   b1: c, a -> g (5)   u: g
# resident with no swapping: 10 + a | a, b | a, b, c | a, c, g | g
TENSORS = {"w": (10, "weight"), "a": (100, "activation"), "b": (50, "activation"),
           "c": (20, "activation"), "g": (5, "gradient")}
OPS = [
    ("f1", "forward", 1.0, ["w"], ["a"]),
    ("f2", "forward", 2.0, ["a"], ["b"]),
    ("f3", "forward", 4.0, ["b"], ["c"]),
    ("b1", "backward", 8.0, ["c", "a"], ["g"]),
    ("u", "optimizer", 0.5, ["g"], []),
]
RESIDENT = [110, 160, 180, 135, 15]


@pytest.fixture
def estimate():
    return MemoryEstimate(make_profile(TENSORS, OPS), 150)


def test_starts_from_the_no_swap_memory(estimate):
    assert estimate.bytes.tolist() == RESIDENT
    assert estimate.bytes.dtype == np.int64
    assert estimate.budget == 150
    assert estimate.over().tolist() == [False, True, True, False, False]
    assert estimate.any_over()


def test_positions_over_the_budget_in_a_range(estimate):
    assert estimate.over_in(0, 5).tolist() == [1, 2]
    assert estimate.over_in(2, 5).tolist() == [2]
    assert estimate.over_in(3, 5).tolist() == []
    assert estimate.over_in(3, 3).tolist() == [] and estimate.over_in(4, 1).tolist() == []


def test_a_tensor_away_and_back(estimate):
    estimate.remove(100, 1, 3)   # a away during f2 and f3
    assert estimate.bytes.tolist() == [110, 60, 80, 135, 15]
    assert not estimate.any_over() and estimate.over_in(0, 5).tolist() == []
    estimate.add(100, 2, 3)      # back for f3
    assert estimate.bytes.tolist() == [110, 60, 180, 135, 15]
    assert estimate.over_in(0, 5).tolist() == [2]


def test_over_budget_kernel_time_follows_every_change(estimate):
    assert estimate.over_us(0, 5) == 6.0        # f2 (2 us) + f3 (4 us)
    assert estimate.over_us(2, 5) == 4.0
    assert estimate.over_us(3, 5) == 0.0
    assert estimate.over_us(4, 2) == 0.0        # an empty range
    estimate.remove(100, 1, 3)
    assert estimate.over_us(0, 5) == 0.0        # the running sum is rebuilt after a change
    estimate.add(100, 1, 2)
    assert estimate.over_us(0, 5) == 2.0
    assert estimate.over_us(2, 5) == 0.0


def test_over_budget_time_in_a_range_is_summed_in_integer_picoseconds():
    profile = make_profile({"a": (10, "activation")},
                           [("f1", "forward", 0.1, [], ["a"]), ("f2", "forward", 0.2, ["a"], [])])
    estimate = MemoryEstimate(profile, 5)
    assert 0.1 + 0.2 != 0.3
    assert estimate.over_us(0, 2) == 0.3
    assert estimate.over_us(1, 1) == 0.0


def test_over_budget_time_at_a_mask_of_positions(estimate):
    assert estimate.over_us_at() == 6.0
    assert estimate.over_us_at(np.array([True, False, True, True, False])) == 4.0   # f3 only
    assert estimate.over_us_at(np.array([True, False, False, True, True])) == 0.0


def test_last_position_more_bytes_would_put_over_a_limit(estimate):
    assert estimate.last_over(0, 0, 5) == 2
    assert estimate.last_over(30, 0, 5) == 3          # 135 + 30 > 150; 15 + 30 fits
    assert estimate.last_over(30, 0, 3) == 2
    assert estimate.last_over(30, 4, 5) is None
    assert estimate.last_over(10, 3, 3) is None       # an empty range
    assert estimate.last_over(0, 0, 5, limit=170) == 2
    assert estimate.last_over(0, 0, 5, limit=180) is None   # at the limit is not over it
    assert estimate.last_over(1, 0, 5, limit=180.5) == 2    # a limit may be a fraction of the budget
