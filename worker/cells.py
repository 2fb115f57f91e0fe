"""A data file's cells read as numbers and ids, vectorized over an array of cells (str or bytes): what the
encoder (worker/encode.py), the readers and schema inference take a numeric, integer or raw id cell to be.

    float_values(cells) -> (float64 values, missing, ok)   # numeric cells
    int_values(cells) -> (int64 values, ok)                # integer cells (a log_buckets column's)
    raw_ids(cells) -> (uint64 ids, ok)                     # raw categorical cells
    is_missing_text(cell) -> bool                          # one cell: missing?
    float_or_nan(cell) -> float                            # one cell's number, nan for none

    missing  empty, blank, or one of MISSING_TEXTS in any case
    number   Python float() syntax, |x| <= FLOAT32_MAX (3.4e38: a larger one would be inf in the float32
             features); one float() reads as nan is missing
    integer  Python int() syntax, within int64, not -2**63 (MISSING_INT, which a missing cell gives)
    raw id   ASCII digits only, below 2**64 - 1 (leading zeros allowed); an empty or blank cell (whitespace only,
             features.blank_strings) gives 2**64 - 1 (MISSING_CAT), as it gives a hashed one (features.cat_values)
"""

from __future__ import annotations

import math

import numpy as np

from worker.features import MISSING_CAT, MISSING_INT, blank_strings

FLOAT32_MAX = float(np.finfo(np.float32).max)  # the largest numeric cell (float32 features)
_MAX_RAW = "18446744073709551614"  # the largest raw id, 2**64 - 2: 2**64 - 1 is the missing one


def empty_cell(cells: np.ndarray) -> str | bytes:
    """The empty cell of cells' dtype kind (bytes or str)."""
    return b"" if cells.dtype.kind == "S" else ""


MISSING_TEXTS = frozenset({"na", "n/a", "nan", "null", "none", "?"})
"""What a numeric cell may hold for a missing value besides nothing, in any case (R's NA, numpy's nan, SQL's
NULL, Python's None, the UCI files' ?)."""


def is_missing_text(cell: str | bytes) -> bool:
    """Whether a numeric cell says its value is missing: empty, blank, or one of MISSING_TEXTS."""
    text = cell.decode("latin-1") if isinstance(cell, bytes) else cell
    return not text.strip() or text.strip().lower() in MISSING_TEXTS


def float_values(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(float64 values, missing, ok) of numeric cells: missing where the cell is empty, blank or one of
    MISSING_TEXTS, ok where it is missing or a number float32 holds (Python float() syntax, |x| <= 3.4e38: a larger
    one would become inf in the float32 features); values 0 where missing or not ok. Vectorized unless a cell is
    blank or not a number."""
    cells = np.asarray(cells)
    missing = cells == empty_cell(cells)
    try:
        values = np.where(missing, _zero(cells), cells).astype(np.float64)
        missing |= np.isnan(values)  # "nan", "NaN": the only texts float() reads as nan
    except ValueError:  # parse the distinct cells one by one
        uniq, inverse = np.unique(cells, return_inverse=True)
        listed = uniq.tolist()
        inverse = inverse.reshape(cells.shape)
        values = np.array([float_or_nan(s) for s in listed], dtype=np.float64)[inverse]
        missing = np.array([is_missing_text(s) or _is_nan_number(s) for s in listed], dtype=bool)[inverse]
    values[missing] = 0.0
    ok = missing | (np.abs(values) <= FLOAT32_MAX)  # nan and inf fail it too
    values[~ok] = 0.0
    return values, missing, ok


def _is_nan_number(s: str | bytes) -> bool:
    """Whether float() reads s as nan ("nan", "-NaN"): missing, as on the vectorized path."""
    try:
        return math.isnan(float(s))
    except ValueError:
        return False


def float_or_nan(s: str | bytes) -> float:
    """The number a cell holds, or nan for one that is not a number."""
    try:
        return float(s)
    except ValueError:
        return math.nan


def _zero(cells: np.ndarray) -> str | bytes:
    return b"0" if cells.dtype.kind == "S" else "0"


def int_values(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values, ok) of integer cells (Python int() syntax, within int64, not -2**63): a missing cell (empty,
    blank or one of MISSING_TEXTS, as for float_values) is MISSING_INT and ok; a bad cell gives MISSING_INT, not
    ok. Vectorized unless a cell is missing-but-not-empty or bad."""
    cells = np.asarray(cells)
    empty = cells == empty_cell(cells)
    try:
        values = np.where(empty, _zero(cells), cells).astype(np.int64)
        ok = empty | (values != MISSING_INT)
    except (ValueError, OverflowError):
        uniq, inverse = np.unique(cells, return_inverse=True)
        listed, inverse = uniq.tolist(), inverse.reshape(cells.shape)
        values = np.array([_int64_or_missing(s) for s in listed], dtype=np.int64)[inverse]
        empty |= np.array([is_missing_text(s) for s in listed], dtype=bool)[inverse]
        ok = empty | (values != MISSING_INT)
    values[empty | ~ok] = MISSING_INT
    return values, ok


def _int64_or_missing(s: str | bytes) -> int:
    try:
        v = int(s)
    except ValueError:
        return int(MISSING_INT)
    return v if int(MISSING_INT) < v <= np.iinfo(np.int64).max else int(MISSING_INT)


def raw_ids(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 ids, ok) of decimal cells: digits only and < 2**64 - 1; an empty or blank cell gives 2**64 - 1, ok."""
    cells = np.asarray(cells)
    if len(cells) == 0:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=bool)
    lengths = np.strings.str_len(cells)
    ok = np.strings.isdecimal(cells) if cells.dtype.kind == "U" else np.strings.isdigit(cells)
    digits = np.strings.lstrip(cells, cells.dtype.type("0"))  # the number's digits: leading zeros say nothing
    width = np.strings.str_len(digits)
    ok &= (width < 20) | ((width == 20) & (digits <= cells.dtype.type(_MAX_RAW)))
    if cells.dtype.kind == "U":  # str.isdecimal takes other scripts' digits too: ASCII digits only
        codes = np.ascontiguousarray(cells).view(np.uint32).reshape(len(cells), -1)
        ok &= (codes < 128).all(axis=1)
    ids = np.full(len(cells), MISSING_CAT, dtype=np.uint64)
    ids[ok] = cells[ok].astype(np.uint64)
    ok |= lengths == 0
    if not ok.all():
        ok[~ok] = blank_strings(cells[~ok])
    return ids, ok
