"""human_bytes, the one form of a byte count shown to people: its boundaries, each against the figure a person
would write, and, over random counts, the rule (under 1,000 of the smallest unit that rounds below it, and within
rounding of the count)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ps.bytesize import bytes_apart, exact_bytes, human_bytes

KiB, MiB, GiB, TiB, PiB = (1 << s for s in (10, 20, 30, 40, 50))
SCALE = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB, "PiB": PiB}


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (999, "999 B"),
        (1000, "1.0 KiB"),  # 0.98 KiB, shown to a tenth
        (1023, "1.0 KiB"),
        (1024, "1.0 KiB"),
        (999 * KiB + 972, "999.9 KiB"),  # 999.949 KiB: the last figure in KiB
        (999 * KiB + 973, "1.0 MiB"),  # 999.950 KiB would read 1,000.0 KiB
        (int(1023.95 * KiB), "1.0 MiB"),  # not "1,024.0 KiB"
        (MiB - 1, "1.0 MiB"),
        (MiB, "1.0 MiB"),
        (int(12.5 * MiB), "12.5 MiB"),
        (1000 * MiB - 1, "0.98 GiB"),  # 999.999 MiB would read 1,000.0 MiB
        (2 * GiB, "2.00 GiB"),
        (999 * GiB, "999.00 GiB"),
        (GiB * 1023, "1.00 TiB"),  # not "1,023.00 GiB"
        (4 * TiB, "4.00 TiB"),  # a 4 TiB disk, not "4,096.00 GiB"
        (TiB + TiB // 5, "1.20 TiB"),
        (PiB - 1, "1.00 PiB"),
        (3 * PiB, "3.00 PiB"),
        (5000 * PiB, "5,000.00 PiB"),  # PiB past 1,000 of it: the largest unit
        (-2 * GiB, "-2.00 GiB"),
        (1536.0, "1.5 KiB"),  # a float count reads as the int would
        (999.4, "999 B"),
    ],
)
def test_human_bytes_at_its_boundaries(n, text):
    assert human_bytes(n) == text


@given(st.integers(0, 2**63))
def test_human_bytes_is_the_smallest_unit_under_1000_and_within_rounding_of_the_count(n):
    text = human_bytes(n)
    number, unit = text.split()
    figure = float(number.replace(",", ""))
    assert figure < 1000 or unit == "PiB", text
    decimals = len(number.partition(".")[2])
    assert abs(figure * SCALE[unit] - n) <= 0.5 * 10**-decimals * SCALE[unit], text
    smaller = list(SCALE)[: list(SCALE).index(unit)]
    assert all(round(n / SCALE[u], 1 if u in ("KiB", "MiB") else 2) >= 1000 for u in smaller if u != "B"), text
    assert unit != "B" or n < 1000


def test_bytes_apart_tells_counts_apart_only_where_their_forms_meet():
    assert bytes_apart(33791, 33792) == ("33,791 bytes", "33,792 bytes")  # both '33.0 KiB'
    assert bytes_apart(20 * KiB, 33792) == ("20.0 KiB", "33.0 KiB")
    assert bytes_apart(MiB, MiB) == ("1.0 MiB", "1.0 MiB")  # equal counts: nothing to tell apart


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (999, "999 B"), (1000, "1.0 KiB (1,000 bytes)"), (KiB, "1.0 KiB"), (229_888, "224.5 KiB"),
     (16 * MiB + 160, "16.0 MiB (16,777,376 bytes)"), (64 * MiB, "64.0 MiB"), (3 * GiB // 2, "1.50 GiB"),
     (10**6, "976.6 KiB (1,000,000 bytes)")],
)  # fmt: skip
def test_exact_bytes_adds_the_exact_count_only_where_the_figure_is_rounded(n, text):
    assert exact_bytes(n) == text


@given(st.integers(min_value=0, max_value=2**62))
def test_exact_bytes_shows_every_count_exactly(n):
    """The oracle: the figure, read as a decimal, times its unit, is n where no count follows it; else the count
    follows, and the figure alone is not n."""
    text = exact_bytes(n)
    figure, unit, *count = text.split(" ", 2)
    shown = Fraction(figure.replace(",", "")) * SCALE[unit]
    assert (count == [] and shown == n) or (count == [f"({n:,} bytes)"] and shown != n), text


@pytest.mark.parametrize(
    ("n", "text"),
    [(-89_908, "-87.8 KiB (-89,908 bytes)"), (56_954_702_318_796, "51.80 TiB (56,954,702,318,796 bytes)")],
)
def test_exact_bytes_gives_the_exact_count_where_human_bytes_rounds_it(n, text):
    """A negative count and one of tebibytes whose figures (-87.8 KiB, 51.80 TiB) are rounded, so that no count can
    be read back from them: human_bytes rounds them, and exact_bytes follows the figure with the exact count."""
    figure, unit = human_bytes(n).split()
    assert Fraction(figure.replace(",", "")) * SCALE[unit] != n  # rounded
    assert exact_bytes(n) == text == f"{human_bytes(n)} ({n:,} bytes)"
