"""Sizes and budgets as users type them (rule R3: KB decimal, KiB binary)."""
import pytest

from simulator.errors import InputError
from simulator.units import format_bytes, format_us, parse_budget, parse_size


@pytest.mark.parametrize("text, expected", [
    ("123", 123), (123, 123), ("8GiB", 8 * 2**30), ("512MB", 512 * 10**6),
    ("1.5TB", 1_500_000_000_000), ("1.5 TiB", int(1.5 * 2**40)), ("4kib", 4096),
    ("2e3", 2000), ("0", 0), ("10B", 10), (" 7 KB ", 7000), (".5GB", 500_000_000),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GB", "-1", "-1GB", "1.2.3", "8 gigs", "12XB", None, True, [], float("nan"), -3])
def test_parse_size_rejects(text):
    with pytest.raises(InputError):
        parse_size(text)


def test_parse_size_error_names_the_field():
    with pytest.raises(InputError) as info:
        parse_size("8QB", where="gpu.memory", file="hw.yaml")
    assert str(info.value).startswith("hw.yaml: gpu.memory: unknown unit 'QB'")


def test_parse_budget_percent_of_peak():
    assert parse_budget("60%", 1000) == 600
    assert parse_budget("12.5 %", 800) == 100
    assert parse_budget("2GiB", 1000) == 2 * 2**30


@pytest.mark.parametrize("text", ["0%", "-5%", "abc%", "%"])
def test_parse_budget_rejects(text):
    with pytest.raises(InputError):
        parse_budget(text, 1000)


def test_format():
    assert format_bytes(1536 * 2**20) == "1.50 GiB"
    assert format_bytes(512) == "512 B"
    assert format_us(812) == "812.0 us"
    assert format_us(12_340) == "12.34 ms"
    assert format_us(1_234_000) == "1.234 s"
