"""byte_size's bounds on a size's exponent: a number too small or too large is refused from its exponent at once, and
one too large says so, naming the bound, through both CLIs' size flags."""

from __future__ import annotations

import argparse
import time

import pytest

from ps.cli_server_flags import parse_bytes
from ps.flagtypes import SIZE_DIGITS, SizeTooLargeError, byte_size
from worker.cli_train_flags import _size


@pytest.mark.parametrize("text", ["1e-10000000", "1e-100000000K", "-1e-100000000G", "1e-100", "5e-101K"])
def test_a_size_with_a_tiny_exponent_is_refused_before_its_bytes_are_worked_out(text):
    """Working out the bytes of 1e-10000000 computes 10**10000000 (seconds; 1e-100000000K far longer); the exponent
    refuses it first, so it returns well within the second allowed."""
    start = time.monotonic()
    with pytest.raises(ValueError, match="not a size") as refused:
        byte_size(text)
    assert time.monotonic() - start < 1.0
    assert not isinstance(refused.value, SizeTooLargeError)


@pytest.mark.parametrize(("text", "size"), [("1e-99K", 0), ("0e-100000000", 0), ("0e100000000G", 0), ("-0", 0)])
def test_a_size_at_the_small_bound_or_zero_of_any_exponent_is_taken(text, size):
    assert byte_size(text) == size


@pytest.mark.parametrize("text", ["1e300", "1e100", "1e100000000", "1e99T", "-1e300", "9765625e90K"])
def test_a_size_of_1e100_bytes_or_more_is_refused_as_too_large_naming_the_bound(text):
    """9765625e90K is exactly 1e100 bytes (9765625 * 1024 = 10**10): the bound is on bytes, units included."""
    with pytest.raises(SizeTooLargeError) as refused:
        byte_size(text)
    side = "above -" if text.startswith("-") else "below "
    assert str(refused.value) == f"size too large: {text!r} (sizes are {side}1e{SIZE_DIGITS} bytes)"
    with pytest.raises(argparse.ArgumentTypeError) as server:
        parse_bytes(text)
    assert str(server.value) == str(refused.value)  # not "expected a whole number of bytes"
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected bytes from 0 to 1024T \("):
        _size(text)


def test_the_largest_size_taken_is_one_byte_below_the_bound():
    assert byte_size("9" * SIZE_DIGITS) == 10**SIZE_DIGITS - 1
    assert byte_size("9765624.999e90K") == 10**SIZE_DIGITS - 1024 * 10**87
