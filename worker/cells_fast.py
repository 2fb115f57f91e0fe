"""Compiled readers of one cell of a byte buffer, shared by the Criteo and CSV scans (worker/criteo_fast.py,
worker/csv_fast.py). Optional speed machinery: each reads a cell as worker/cells.py and worker/features.py
would, and says when it cannot (the caller then leaves the column to them).

    gathered(buf, starts, ends) -> bytes array (n,)       # the cells buf[starts[i]:ends[i]]
    gathered_cat_values(buf, starts, ends) -> uint64 (n,) # features.cat_values of those cells, GATHER_BYTES
                                                          # at a time
    int_cell(buf, s, end)   -> (ok, int64 bits)           # "" -> MISSING_INT; sign? digit+ within (-2**63, 2**63)
    hex_cell(buf, s, end)   -> (ok, uint64)               # "" -> MISSING_CAT; 1..16 hex digits, not all f
    float_cell(buf, s, end) -> (ok, float64)              # "" -> 0 (missing); sign? digit* ("." digit*)? with
                                                          # 1..MAX_DIGITS digits, at most 22 after the point
A float cell is mantissa / 10**(digits after the point): one correctly rounded division of two exact float64s
(the mantissa < 2**53, the power <= 10**22), so the value float() gives.
"""

from __future__ import annotations

import numba
import numpy as np

from worker.features import MISSING_INT, cat_values

MISSING_INT_BITS = np.uint64(int(MISSING_INT) % 2**64)
MISSING_CAT = np.uint64(2**64 - 1)
MAX_DIGITS = 15  # a float cell's digits at most: the mantissa is exact in a float64 (< 2**53)
NOT_DIGIT = np.uint8(255)
DIGITS = np.full(256, NOT_DIGIT, dtype=np.uint8)  # byte -> its value as a decimal digit, else NOT_DIGIT
DIGITS[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
HEX_DIGITS = DIGITS.copy()  # byte -> its value as a hex digit (either case), else NOT_DIGIT
HEX_DIGITS[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
HEX_DIGITS[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)
_TENTH_MAX = np.uint64((2**63 - 1) // 10)  # an int64 magnitude v may take another digit d if v * 10 + d < 2**63
_POWERS = 10.0 ** np.arange(23)  # exact in a float64 up to 10**22


def gathered(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The cells buf[starts[i]:ends[i]] as a bytes array (n,), as wide as the widest (at least 1)."""
    width = max(int((ends - starts).max(initial=0)), 1)
    out = np.zeros((len(starts), width), dtype=np.uint8)
    _gather(buf, starts, ends, out)
    return out.view(f"S{width}").reshape(len(starts))


GATHER_BYTES = 1 << 24  # cells x the widest of them, gathered at a time by gathered_cat_values (unless one is wider)


def gathered_cat_values(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """features.cat_values of the cells buf[starts[i]:ends[i]], uint64 (n,). A bytes array pads every cell to the
    widest: one long cell among thousands would take thousands of times its size, so cells of like widths are
    gathered together, a group of at most GATHER_BYTES (cells x its widest) at a time."""
    widths = np.asarray(ends) - np.asarray(starts)
    if len(widths) == 0 or int(widths.max()) * len(widths) <= GATHER_BYTES:
        return cat_values(gathered(buf, starts, ends))
    order = np.argsort(widths, kind="stable")
    ranked = widths[order]
    out = np.empty(len(order), dtype=np.uint64)
    lo = 0
    while lo < len(order):  # the widest group [lo, hi) within GATHER_BYTES (ranked rises: its widest is its last)
        fits = (np.arange(1, len(order) - lo + 1) * ranked[lo:]) <= GATHER_BYTES
        hi = lo + max(1, int(np.argmin(fits)) if not fits.all() else len(fits))
        at = order[lo:hi]
        out[at] = cat_values(gathered(buf, starts[at], ends[at]))
        lo = hi
    return out


@numba.njit(nogil=True, cache=True)
def _gather(buf, starts, ends, out):
    for i in range(len(starts)):
        s = starts[i]
        for j in range(ends[i] - s):
            out[i, j] = buf[s + j]


@numba.njit(nogil=True, cache=True, inline="always")
def int_cell(buf: np.ndarray, s: int, end: int) -> tuple[bool, np.uint64]:
    """(ok, int64 bits) of an integer cell: "" -> MISSING_INT; sign? digit+ within (-2**63, 2**63)."""
    if s == end:
        return True, MISSING_INT_BITS
    negative = buf[s] == 45  # "-"
    if negative or buf[s] == 43:  # "+"
        s += 1
        if s == end:
            return False, np.uint64(0)
    v = np.uint64(0)
    for p in range(s, end):
        d = DIGITS[buf[p]]
        if d == NOT_DIGIT or v > _TENTH_MAX or (v == _TENTH_MAX and d > 7):
            return False, np.uint64(0)
        v = v * np.uint64(10) + np.uint64(d)
    return True, (np.uint64(0) - v) if negative else v


@numba.njit(nogil=True, cache=True, inline="always")
def hex_cell(buf: np.ndarray, s: int, end: int) -> tuple[bool, np.uint64]:
    """(ok, value) of a categorical cell: "" -> MISSING_CAT; 1..16 hex digits -> their number, unless it is
    MISSING_CAT; not ok for any other cell."""
    if s == end:
        return True, MISSING_CAT
    if end - s > 16:
        return False, np.uint64(0)
    v = np.uint64(0)
    for p in range(s, end):
        d = HEX_DIGITS[buf[p]]
        if d == NOT_DIGIT:
            return False, np.uint64(0)
        v = (v << np.uint64(4)) | np.uint64(d)
    return v != MISSING_CAT, v


@numba.njit(nogil=True, cache=True, inline="always")
def float_cell(buf: np.ndarray, s: int, end: int) -> tuple[bool, float]:
    """(ok, value) of a numeric cell: "" -> 0 (missing); sign? digit* ("." digit*)? with 1..MAX_DIGITS digits, at
    most 22 after the point -> mantissa / 10**fraction digits; not ok for any other cell."""
    if s == end:
        return True, 0.0
    negative = buf[s] == 45  # "-"
    if negative or buf[s] == 43:  # "+"
        s += 1
    m, digits, fraction, point = 0, 0, 0, False
    for p in range(s, end):
        c = buf[p]
        if 48 <= c <= 57:
            m = m * 10 + (c - 48)
            digits += 1
            fraction += point
        elif c == 46 and not point:  # "."
            point = True
        else:
            return False, 0.0
    if digits == 0 or digits > MAX_DIGITS or fraction > 22:
        return False, 0.0
    x = float(m) / _POWERS[fraction]
    return True, -x if negative else x
