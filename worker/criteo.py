"""Reader and writer for the Criteo Kaggle text format, producing Batches of hashed ids.

File grammar (one example per line, UTF-8):

    file    := line*                                    # the last line's NEWLINE may be missing
    line    := label TAB int{13} cat{26} NEWLINE        # 40 tab-separated columns; TAB between columns
    NEWLINE := "\n" | "\r\n"
    label   := "0" | "1"
    int     := "" | a base-10 integer (Python int() syntax, within int64; not -2**63, which means missing)
    cat     := "" | a string without TAB or NEWLINE     # Criteo: 8 lowercase hex digits

An empty column is a missing value. Raw values become ids as described in worker/features.py.
The writer emits integers in base 10 and categoricals as lowercase hex, 8 digits for values < 2**32 and
16 otherwise; reading a written file gives exactly the ids computed from the raw values.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import numpy as np

from worker.features import (
    MISSING_CAT,
    MISSING_INT,
    NUM_CAT_FIELDS,
    NUM_FIELDS,
    NUM_INT_FIELDS,
    Batch,
    cat_values,
    dense_features,
    example_ids,
)

NUM_COLUMNS = 1 + NUM_FIELDS  # label + features
_WRITE_ROWS = 65536  # rows formatted at a time by write_criteo
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def read_criteo(path: str | os.PathLike, batch_size: int) -> Iterator[Batch]:
    """Yield Batches of up to batch_size examples (probs None), in file order. LF or CRLF line ends.

    Raises ValueError naming the file, the 1-based line number, what arrived and what was expected, at the
    first malformed line (wrong column count, label not 0/1, integer feature not an int64 integer).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size is {batch_size}, expected >= 1")
    name = os.fspath(path)
    with open(path, "rb") as f:
        first_line = 1
        while True:
            lines = list(itertools.islice(f, batch_size))
            if not lines:
                return
            yield _parse_lines(b"".join(lines), name, first_line)
            first_line += len(lines)


def _parse_lines(chunk: bytes, name: str, first_line: int) -> Batch:
    """Parse whole lines (the last newline optional) vectorized: one split of the chunk, then per column."""
    if not chunk.endswith(b"\n"):
        chunk += b"\n"
    if b"\r" in chunk:
        chunk = chunk.replace(b"\r\n", b"\n")
    buf = np.frombuffer(chunk, dtype=np.uint8)
    line_ends = np.flatnonzero(buf == ord("\n"))
    tabs_before = np.searchsorted(np.flatnonzero(buf == ord("\t")), line_ends)
    counts = np.diff(tabs_before, prepend=0) + 1
    bad = np.flatnonzero(counts != NUM_COLUMNS)
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{name} line {first_line + i}: {counts[i]} tab-separated columns, expected {NUM_COLUMNS}")
    fields = chunk[:-1].replace(b"\n", b"\t").split(b"\t")
    columns = np.array(fields, dtype=np.bytes_).reshape(len(line_ends), NUM_COLUMNS)

    label_col = columns[:, 0]
    is_one = label_col == b"1"
    bad = np.flatnonzero(~is_one & (label_col != b"0"))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{name} line {first_line + i}: label {_text(label_col[i])!r}, expected '0' or '1'")

    int_values = _parse_ints(columns[:, 1 : 1 + NUM_INT_FIELDS], name, first_line)
    cats = cat_values(columns[:, 1 + NUM_INT_FIELDS :])
    return Batch(labels=is_one.astype(np.float32), ids=example_ids(int_values, cats), dense=dense_features(int_values))


def _text(field: bytes) -> str:
    return field.decode("utf-8", "replace")


def _parse_ints(strings: np.ndarray, name: str, first_line: int) -> np.ndarray:
    """(n, 13) bytes -> int64, empty -> MISSING_INT; ValueError at the first bad entry."""
    empty = strings == b""
    try:
        values = np.where(empty, b"0", strings).astype(np.int64)
        bad = np.argwhere(~empty & (values == MISSING_INT))
    except (ValueError, OverflowError):  # slow path, only to name the first bad entry
        values = None
        bad = np.argwhere(~np.vectorize(_is_int64, otypes=[bool])(strings) & ~empty)
    if len(bad) or values is None:
        i, j = (int(k) for k in bad[0]) if len(bad) else (0, 0)
        raise ValueError(
            f"{name} line {first_line + i}: integer feature I{j + 1} is {_text(strings[i, j])!r}, "
            f"expected empty or a base-10 integer in ({MISSING_INT}, {np.iinfo(np.int64).max}]"
        )
    values[empty] = MISSING_INT
    return values


def _is_int64(s: bytes) -> bool:
    try:
        return int(MISSING_INT) < int(s) <= np.iinfo(np.int64).max
    except ValueError:
        return False


def format_criteo(labels: np.ndarray, int_values: np.ndarray, cat_values: np.ndarray) -> str:
    """The file text of n examples: labels (n,) in {0, 1}; int_values int64 (n, 13), MISSING_INT -> empty;
    cat_values uint64 (n, 26), MISSING_CAT -> empty. Every line ends with a newline."""
    labels = np.asarray(labels)
    int_values = np.asarray(int_values, dtype=np.int64)
    cat_values = np.asarray(cat_values, dtype=np.uint64)
    n = len(labels)
    if labels.shape != (n,) or int_values.shape != (n, NUM_INT_FIELDS) or cat_values.shape != (n, NUM_CAT_FIELDS):
        raise ValueError(
            f"labels {labels.shape}, int_values {int_values.shape}, cat_values {cat_values.shape}; "
            f"expected ({n},), ({n}, {NUM_INT_FIELDS}), ({n}, {NUM_CAT_FIELDS})"
        )
    if not np.isin(labels, (0, 1)).all():
        raise ValueError("labels must all be 0 or 1")
    if n == 0:
        return ""
    columns = np.empty((n, NUM_COLUMNS), dtype=object)
    columns[:, 0] = np.where(labels == 1, "1", "0")
    columns[:, 1 : 1 + NUM_INT_FIELDS] = np.where(int_values == MISSING_INT, "", int_values.astype(np.str_))
    columns[:, 1 + NUM_INT_FIELDS :] = _hex_strings(cat_values)
    return "".join("\t".join(row) + "\n" for row in columns.tolist())


def _hex_strings(values: np.ndarray) -> np.ndarray:
    """uint64 -> lowercase hex str, 8 digits below 2**32 else 16; MISSING_CAT -> ''."""
    shifts = np.arange(60, -4, -4, dtype=np.uint64)
    digits = _HEX[((values[..., None] >> shifts) & np.uint64(15)).astype(np.intp)]  # (..., 16) ASCII
    digits = np.ascontiguousarray(digits)
    long = digits.view("S16")[..., 0].astype(np.str_)
    short = np.ascontiguousarray(digits[..., 8:]).view("S8")[..., 0].astype(np.str_)
    out = np.where(values < np.uint64(2**32), short, long)
    return np.where(values == MISSING_CAT, "", out)


def write_criteo(path: str | os.PathLike, labels: np.ndarray, int_values: np.ndarray, cat_values: np.ndarray) -> None:
    """Write n examples to path in the Criteo format (see format_criteo for the arrays), replacing the file."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for lo in range(0, max(len(labels), 1), _WRITE_ROWS):
            hi = lo + _WRITE_ROWS
            f.write(format_criteo(labels[lo:hi], int_values[lo:hi], cat_values[lo:hi]))
