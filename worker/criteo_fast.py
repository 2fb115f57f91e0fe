"""A compiled scan of whole Criteo lines (the grammar of worker/criteo.py) for the lines common data is made of.

    scan_lines(lines, int_sources, cat_sources) -> Scanned | None

One compiled scan of the chunk (numba, nogil) finds the 40 cells of every line and reads them as the reference
path (criteo.parse_lines, then encode.encode_examples) would:

    label          "0" | "1"                                   -> float32 0 or 1
    int_sources    "" | sign? digit+, within (-2**63, 2**63)   -> int64 (cells.int_values; "" -> MISSING_INT)
                   sign := "+" | "-"
    cat_sources    "" -> MISSING_CAT; 1..16 hex digits, either case, other than "ffffffffffffffff" -> their
                   number; any other cell -> features.cat_values of its bytes (cells_fast.gathered_cat_values)

Cells of the other columns are read on first use as bytes arrays (dtype S, like parse_lines's columns: trailing
NULs dropped). A chunk with a line outside this grammar (a column count other than 40, any other label, an
integer cell of any other form) gives None: the caller parses it with criteo.parse_share, the judge of bad
lines and of their messages.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numba
import numpy as np

from worker.cells_fast import HEX_DIGITS, MISSING_CAT, gathered, gathered_cat_values, hex_cell, int_cell
from worker.encode import Parsed
from worker.schema_columns import CRITEO_COLUMNS

_SOURCES = CRITEO_COLUMNS[1:]  # I1..I13, C1..C26: the cells after the label
_SKIP, _INT, _HEX = 0, 1, 2  # how the scan reads a column's cells


@dataclass
class Scanned:
    """A chunk of n lines: labels float32 (n,); cells {source: bytes array (n,)} of every column (read on first
    use); parsed: the int_sources and cat_sources, read (see the module docstring)."""

    labels: np.ndarray
    cells: Mapping[str, np.ndarray]
    parsed: Parsed


def scan_lines(lines: Sequence[bytes], int_sources: Collection[str], cat_sources: Collection[str]) -> Scanned | None:
    """The lines (each ending in a newline, the last one optional; LF or CRLF), or None when one is outside the
    module docstring's grammar. A source in both collections is read as an integer only."""
    n = len(lines)
    chunk = b"".join(lines)
    if not chunk.endswith(b"\n"):
        chunk += b"\n"
    modes = np.array([_INT if s in int_sources else _HEX if s in cat_sources else _SKIP for s in _SOURCES], np.uint8)
    buf = np.frombuffer(chunk, dtype=np.uint8)
    labels = np.empty(n, dtype=np.float32)
    offset = np.int32 if len(buf) < 2**31 else np.int64
    starts = np.empty((n, len(_SOURCES)), dtype=offset)  # cell k of line i is buf[starts[i, k]:ends[i, k]]
    ends = np.empty((n, len(_SOURCES)), dtype=offset)
    values = np.empty((n, len(_SOURCES)), dtype=np.uint64)  # int64 bits (_INT) or the categorical value (_HEX)
    other = np.zeros((n, len(_SOURCES)), dtype=np.bool_)  # _HEX cells left to features.cat_values
    if not _scan(buf, modes, labels, starts, ends, values, other):
        return None
    if other.any():
        at = np.nonzero(other)
        values[at] = gathered_cat_values(buf, starts[at], ends[at])
    ints = {s: values[:, k].view(np.int64) for k, s in enumerate(_SOURCES) if modes[k] == _INT}
    cats = {s: values[:, k] for k, s in enumerate(_SOURCES) if modes[k] == _HEX}
    return Scanned(labels, _LazyCells(buf, starts, ends), Parsed(ints, cats))


class _LazyCells(Mapping):
    """{source: bytes array (n,)} of a scanned chunk, each column gathered on first use."""

    def __init__(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray):
        self._buf, self._starts, self._ends = buf, starts, ends
        self._columns: dict[str, np.ndarray] = {}

    def __getitem__(self, source: str) -> np.ndarray:
        if source not in self._columns:
            if source not in _SOURCES:
                raise KeyError(source)
            k = _SOURCES.index(source)
            self._columns[source] = gathered(self._buf, self._starts[:, k], self._ends[:, k])
        return self._columns[source]

    def __contains__(self, source: object) -> bool:
        return source in _SOURCES

    def __iter__(self) -> Iterator[str]:
        return iter(_SOURCES)

    def __len__(self) -> int:
        return len(_SOURCES)


_TAB, _NL, _CR = 9, 10, 13
_OTHER_CLASS, _END_CLASS = np.uint8(16), np.uint8(17)
_CLASSES = np.minimum(HEX_DIGITS, _OTHER_CLASS)  # byte -> hex digit value, _OTHER_CLASS, or _END_CLASS for
_CLASSES[[_TAB, _NL]] = _END_CLASS  # the bytes that end a cell


@numba.njit(nogil=True, cache=True)
def _scan(buf, modes, labels, starts, ends, values, other):
    """Fill the arrays (see scan_lines) from buf, which ends in NEWLINE, one line per label; False when a line
    is outside the grammar or buf holds another number of lines."""
    columns = len(modes) + 1
    s = 0
    for i in range(len(labels)):
        if s == len(buf):
            return False
        for j in range(columns):
            e, v, hex_digits = s, np.uint64(0), True
            if j > 0 and modes[j - 1] == _HEX:  # find the cell's end, reading it as hex on the way
                c = _CLASSES[buf[e]]
                while c < _END_CLASS:
                    v = (v << np.uint64(4)) | np.uint64(c)
                    hex_digits &= c != _OTHER_CLASS
                    e += 1
                    c = _CLASSES[buf[e]]
            else:
                while buf[e] != _TAB and buf[e] != _NL:
                    e += 1
            if (buf[e] == _NL) != (j == columns - 1):
                return False
            end = e - 1 if buf[e] == _NL and e > s and buf[e - 1] == _CR else e
            if j == 0:
                if end - s != 1 or (buf[s] != 48 and buf[s] != 49):  # "0" or "1"
                    return False
                labels[i] = buf[s] - 48
                s = e + 1
                continue
            k = j - 1
            starts[i, k], ends[i, k] = s, end
            if modes[k] == _INT:
                ok, value = int_cell(buf, s, end)
                if not ok:
                    return False
                values[i, k] = value
            elif modes[k] == _HEX:
                if end != e:  # a CR cut off: read again
                    hex_digits, v = hex_cell(buf, s, end)
                elif s == e:
                    v = MISSING_CAT
                else:
                    hex_digits &= e - s <= 16 and v != MISSING_CAT
                values[i, k] = v
                other[i, k] = not hex_digits
            s = e + 1
    return s == len(buf)
