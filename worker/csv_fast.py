"""A CSV file's physical lines as bytes, and a compiled scan of the plain lines common data is made of.

    CsvLines(raw)                                   # the lines after a leading BOM (UTF-8)
        .texts() -> Iterator[str]                   # each line decoded, for the csv module
        .take_plain(worker_id, num_workers, index, want) -> Plain   # a run of plain lines, this share's
    scan_plain(plain, delimiter, width, label_at, sources, parsed) -> Scanned
    label_value(cell) -> float                      # a label cell's value, for the scan and the csv module alike

Optional speed machinery: worker/readers/csv_reader.py reads a CSV chunk through take_plain and scan_plain when
its lines are plain, else through the csv module over texts() (csv_reader.CSV_SCAN = False: always), with the
same result.

Physical lines end at "\n", "\r\n" or a lone "\r" (as io.TextIOWrapper(newline="") splits them, the way the
csv module reads a file), or at the end of the file. A line is plain when it holds no quote character ("),
no NUL and no lone "\r", and is at most MAX_PLAIN_BYTES long. The csv module reads a plain line as exactly one
record: its text without the line end, split at every delimiter (an empty line: no cell). So, over a run of
plain lines, records are lines, and record k of the file belongs to worker k % n.

Plain (take_plain): of the plain lines from the current one, those of the share (record index % num_workers
== worker_id, counting from `index`, the records before), each copied without its line end and followed by
"\n", until `want` of them or a line that is not plain (where the run stops, unread) or the end of the file.

Scanned (scan_plain), per line of a Plain:
    columns  its cell count (an empty line: 0)
    label    the label cell's value ("0" and "1" read in the scan, other text by label_value), NaN if unread
    cells    of the sources (header positions), gathered on first use: bytes arrays (dtype S) when the run is
             ASCII, else str arrays of the UTF-8 text
    widths   the longest source cell, in characters
and the cells of parsed's sources (int, cat and float: encode.parsed_sources) as worker/encode.py reads them:
    cats     "" -> MISSING_CAT; 1..16 hex digits, not all f -> their number (in the scan); other text ->
             features.cat_values of its bytes (a run the scan reads is UTF-8)
    ints     "" -> MISSING_INT; sign? digit+ within (-2**63, 2**63) -> its value; other cells: not simple
    floats   "" -> 0, missing; sign? digit* ("." digit*)? with 1..15 digits, at most 22 after the point ->
             mantissa / 10**(digits after the point), one correctly rounded division of exact float64s, so the
             value float() gives; other cells: not simple
The caller takes a column's ints or floats where all of its good lines' cells are simple, else leaves the
column to worker/encode.py.
"""

from __future__ import annotations

import math
import re
from codecs import BOM_UTF8
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import BinaryIO

import numba
import numpy as np

from worker.cells_fast import float_cell, gathered, gathered_cat_values, hex_cell, int_cell

BLOCK_BYTES = 1 << 22  # read from the file at a time (cut after its last line end, CsvLines._fill)
MAX_PLAIN_BYTES = 1 << 30  # a longer line goes to the csv module, which judges its field size limit
_RUN, _FULL, _STOPPED = 0, 1, 2  # _select's outcomes: the block ended, `want` lines taken, a line not plain


@dataclass
class Plain:
    """A run of plain lines: buf, uint8, this share's lines, each ending in "\\n"; lines: the physical lines the
    run took, every share's; first: the offset in the run of this share's first line (then every n-th); stopped:
    whether it ended at a line that is not plain; ascii: whether buf holds only ASCII."""

    buf: np.ndarray
    count: int
    lines: int
    first: int
    stopped: bool
    ascii: bool


class CsvLines:
    """The physical lines of a binary file (see the module docstring); `consumed` counts those taken so far."""

    def __init__(self, raw: BinaryIO):
        self._raw, self._buf, self._pos, self._eof, self._start = raw, b"", 0, False, True
        self._rest = b""  # read past the last line end of buf: the start of the next buf
        self.consumed = 0

    def _fill(self) -> bool:
        """Whether lines are left; buf[pos:] then holds whole lines (the last one may be the file's end): blocks
        of BLOCK_BYTES cut after their last line end (of any kind: a file of lines ended by CR alone is read a
        block at a time too), a line longer than a block read whole."""
        while self._pos >= len(self._buf):
            if self._eof and not self._rest:
                return False
            parts, cut = [self._rest], 0
            while not self._eof and not cut:
                block = self._raw.read(BLOCK_BYTES)
                self._eof = not block
                parts.append(block)
                cut = _after_last_line_end(block)
            data = b"".join(parts)
            if cut:
                cut += len(data) - len(parts[-1])
                data, self._rest = data[:cut], data[cut:]
            else:
                self._rest = b""
            self._buf, self._pos = data.removeprefix(BOM_UTF8) if self._start else data, 0
            self._start = False
        return True

    def texts(self) -> Iterator[str]:
        """The lines from the current one, each decoded (UTF-8, bad bytes as surrogates) with its line end."""
        while self._fill():
            buf, pos = self._buf, self._pos
            line_end = _LINE_END.search(buf, pos)  # the first one only: a search to the end per line is quadratic
            end = len(buf) if line_end is None else line_end.end()
            self._pos = end
            self.consumed += 1
            yield buf[pos:end].decode("utf-8", "surrogateescape")

    def take_plain(self, worker_id: int, num_workers: int, index: int, want: int) -> Plain:
        """This share's plain lines from the current one (see Plain and the module docstring)."""
        parts, count, lines, status, ascii_ = [], 0, 0, _RUN, True
        first = (worker_id - index) % num_workers
        while count < want and status == _RUN and self._fill():
            block = np.frombuffer(self._buf, dtype=np.uint8)
            out = np.empty(len(block) - self._pos + 1, dtype=np.uint8)
            skip = (first - lines) % num_workers
            pos, k, taken, used, status, high = _select(block, self._pos, skip, num_workers, want - count, out)
            parts.append(out[:used] if 2 * used > len(out) else out[:used].copy())  # a share's 1/n: copied
            self._pos, lines, count, ascii_ = pos, lines + k, count + taken, ascii_ and not high
        self.consumed += lines
        buf = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)
        return Plain(buf, count, lines, first, status == _STOPPED, ascii_)


_LINE_END = re.compile(rb"\r\n|\r|\n")  # a physical line's end (the module docstring)


def _after_last_line_end(block: bytes) -> int:
    """The offset just past the last line end a block read from a file holds for sure, 0 if none: a LF, or a CR
    before the block's last byte (a CR that ends the block may begin a CRLF whose LF the next block holds)."""
    return max(block.rfind(b"\n"), block.rfind(b"\r", 0, len(block) - 1)) + 1


_NL, _CR = 10, 13
_PLAIN, _END, _NOT_PLAIN, _CR_CLASS, _HIGH = 0, 1, 2, 3, 4  # _select's byte classes
_CLASSES = np.zeros(256, dtype=np.uint8)
_CLASSES[128:] = _HIGH
_CLASSES[[ord('"'), 0]] = _NOT_PLAIN
_CLASSES[_CR], _CLASSES[_NL] = _CR_CLASS, _END


@numba.njit(nogil=True, cache=True)
def _select(block, pos, skip, n, want, out):
    """(pos, lines, taken, used, outcome, high): from block[pos:] (whole lines), the plain lines, of which every
    n-th from the skip-th is copied to out (used bytes) until `want` are or a line is not plain (pos stays at its
    start); high: whether a copied byte is >= 128."""
    lines, taken, used, high = 0, 0, 0, False
    end = len(block)
    while pos < end:
        if taken == want:
            return pos, lines, taken, used, _FULL, high
        e, line_high = pos, False
        while e < end:
            k = _CLASSES[block[e]]
            if k != _PLAIN:
                if k == _END:
                    break
                if k == _NOT_PLAIN or (k == _CR_CLASS and (e + 1 == end or block[e + 1] != _NL)):
                    return pos, lines, taken, used, _STOPPED, high
                line_high |= k == _HIGH
            e += 1
        stop = e - 1 if e > pos and block[e - 1] == _CR else e  # the line without its line end
        if stop - pos > MAX_PLAIN_BYTES:
            return pos, lines, taken, used, _STOPPED, high
        if lines >= skip and (lines - skip) % n == 0:
            out[used : used + stop - pos] = block[pos:stop]
            used += stop - pos
            out[used] = _NL
            used += 1
            taken += 1
            high |= line_high
        lines += 1
        pos = e + 1 if e < end else e
    return pos, lines, taken, used, _FULL if taken == want else _RUN, high


@dataclass
class Scanned:
    """Per line of a Plain (see the module docstring): columns int64 (m,); labels float32 (m,); cells
    {source: (m,) array}; cats {source: uint64 (m,)}; ints {source: (int64 values, simple)}; floats {source:
    (float64 values, missing, simple)}; widths int64 (m,); line(i) and label(i) give the text of a line (without
    its end) and of its label cell."""

    columns: np.ndarray
    labels: np.ndarray
    cells: _LazyCells
    cats: dict[str, np.ndarray]
    ints: dict[str, tuple[np.ndarray, np.ndarray]]
    floats: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    widths: np.ndarray
    _buf: np.ndarray
    _bounds: np.ndarray
    _label_starts: np.ndarray
    _label_ends: np.ndarray

    def line(self, i: int) -> str:
        return _text(self._buf[self._bounds[i] : self._bounds[i + 1] - 1])

    def label(self, i: int) -> str:
        return _text(self._buf[self._label_starts[i] : self._label_ends[i]])

    def blank(self, delimiter: str) -> np.ndarray:
        """bool (m,): the lines of nothing but the delimiter (ASCII, as every delimiter of a plain run) and what
        str.strip() strips (every cell blank), in a compiled pass that stops at a line's first other character."""
        out = np.empty(len(self.columns), dtype=np.bool_)
        _blank_lines(self._buf, self._bounds, ord(delimiter), out)
        return out


@numba.njit(inline="always")
def _three_byte_space(b: int, b1: int, b2: int) -> bool:
    """Whether bytes b b1 b2 are the UTF-8 of U+1680 (E1 9A 80), U+2000-U+200A, U+2028, U+2029, U+202F (E2 80 xx),
    U+205F (E2 81 9F) or U+3000 (E3 80 80)."""
    if b == 0xE1:
        return b1 == 0x9A and b2 == 0x80
    if b == 0xE3:
        return b1 == 0x80 and b2 == 0x80
    if b != 0xE2:
        return False
    if b1 == 0x81:
        return b2 == 0x9F
    return b1 == 0x80 and (0x80 <= b2 <= 0x8A or b2 == 0xA8 or b2 == 0xA9 or b2 == 0xAF)


@numba.njit(nogil=True, cache=True)
def _blank_lines(buf: np.ndarray, bounds: np.ndarray, delimiter: int, out: np.ndarray) -> None:
    """out[i]: whether line i (UTF-8, buf[bounds[i]:bounds[i + 1]]) holds only the delimiter byte and characters
    str.isspace() is true of: tab, LF, VT, FF, CR, 0x1c-0x1f, space, and U+0085, U+00A0, U+1680, U+2000-U+200A,
    U+2028, U+2029, U+202F, U+205F, U+3000 (read as their UTF-8 bytes)."""
    for i in range(len(bounds) - 1):
        p, end, blank = bounds[i], bounds[i + 1], True
        while p < end:
            b = buf[p]
            b1 = buf[p + 1] if p + 1 < end else 0
            b2 = buf[p + 2] if p + 2 < end else 0
            if b == delimiter or b == 32 or 9 <= b <= 13 or 28 <= b <= 31:
                p += 1
            elif b == 0xC2 and (b1 == 0x85 or b1 == 0xA0):
                p += 2
            elif _three_byte_space(b, b1, b2):
                p += 3
            else:
                blank = False
                break
        out[i] = blank


def _text(cell: np.ndarray) -> str:
    return cell.tobytes().decode("utf-8", "surrogateescape")


def scan_plain(plain: Plain, delimiter: str, width: int, label_at: int | None, sources: dict[str, int],
               parsed: tuple[Collection[str], Collection[str], Collection[str]]) -> Scanned:  # fmt: skip
    """The lines of a Plain split at the delimiter (one ASCII character), of a header of `width` columns: the
    label at label_at (None: none read), sources {name: header position}; of parsed (int, cat and float sources,
    encode.parsed_sources) the cells read as the module docstring says. Cells past a line's count are empty (its
    count says it is bad)."""
    m, names = plain.count, list(sources)
    ints, cats, floats = parsed
    slots = [label_at if label_at is not None else -1, *(sources[s] for s in names)]
    slot_of = np.full(width, -1, dtype=np.int64)
    for k, j in enumerate(slots):
        if j >= 0:
            slot_of[j] = k
    modes = [_INT if s in ints else _HEX if s in cats else _FLOAT if s in floats else _SKIP for s in names]
    modes = np.array([_SKIP, *modes], dtype=np.uint8)
    columns = np.empty(m, dtype=np.int64)
    starts = np.zeros((m, len(slots)), dtype=np.int64)
    ends = np.zeros((m, len(slots)), dtype=np.int64)
    values = np.zeros((m, len(slots)), dtype=np.uint64)  # cat values or int64 bits
    numbers = np.zeros((m, len(slots)), dtype=np.float64)
    other = np.zeros((m, len(slots)), dtype=np.bool_)  # cells outside the scan's grammar
    widths = np.zeros(m, dtype=np.int64)
    bounds = np.zeros(m + 1, dtype=np.int64)
    _scan(plain.buf, ord(delimiter), slot_of, modes, columns, starts, ends, values, numbers, other, widths,
          plain.ascii, bounds)  # fmt: skip
    labels = np.full(m, np.nan, dtype=np.float64)
    if label_at is not None:
        labels = _labels(plain.buf, starts[:, 0], ends[:, 0])
    out_cats, out_ints, out_floats = {}, {}, {}
    for k, s in enumerate(names, start=1):
        if modes[k] == _HEX:
            v = values[:, k]
            if other[:, k].any():
                at = np.flatnonzero(other[:, k])
                v[at] = gathered_cat_values(plain.buf, starts[at, k], ends[at, k])
            out_cats[s] = v
        elif modes[k] == _INT:
            out_ints[s] = (values[:, k].view(np.int64), ~other[:, k])
        elif modes[k] == _FLOAT:
            out_floats[s] = (numbers[:, k], ends[:, k] == starts[:, k], ~other[:, k])
    cells = _LazyCells(plain.buf, starts, ends, {s: k for k, s in enumerate(names, start=1)}, plain.ascii)
    return Scanned(columns, labels, cells, out_cats, out_ints, out_floats, widths, plain.buf, bounds,
                   starts[:, 0], ends[:, 0])  # fmt: skip


def _labels(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """float64 of label cells: "0" and "1" directly, any other text by label_value."""
    one = (ends - starts == 1) & (buf[starts] == ord("1"))
    zero = (ends - starts == 1) & (buf[starts] == ord("0"))
    labels = np.where(one, 1.0, 0.0)
    for i in np.flatnonzero(~(one | zero)).tolist():
        labels[i] = label_value(_text(buf[starts[i] : ends[i]]))
    return labels


_BOOLS = {"true": 1.0, "false": 0.0, "yes": 1.0, "no": 0.0}
BOOL_LABELS = "true and false, yes and no, any case"  # _BOOLS, as messages name them (1 and 0)


def label_value(cell: str) -> float:
    """A CSV label cell's value: float()'s, else 1 for true or yes and 0 for false or no in any case, surrounding
    whitespace allowed (pandas writes a bool column as True and False; surveys and exports write yes and no), else
    NaN."""
    try:
        return float(cell)
    except ValueError:
        return _BOOLS.get(cell.strip().lower(), math.nan)


class _LazyCells(Mapping):
    """{source: (m,) cells} of a scanned Plain, each gathered on first use (see Scanned); rows(at) keeps lines."""

    def __init__(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, slots: dict[str, int], ascii_: bool):
        self._buf, self._starts, self._ends, self._slots, self._ascii = buf, starts, ends, slots, ascii_
        self._columns: dict[str, np.ndarray] = {}

    def rows(self, at: np.ndarray | slice) -> _LazyCells:
        return _LazyCells(self._buf, self._starts[at], self._ends[at], self._slots, self._ascii)

    def __getitem__(self, source: str) -> np.ndarray:
        if source not in self._columns:
            k = self._slots[source]
            cells = gathered(self._buf, self._starts[:, k], self._ends[:, k])
            self._columns[source] = cells if self._ascii else np.strings.decode(cells, "utf-8")
        return self._columns[source]

    def __contains__(self, source: object) -> bool:
        return source in self._slots

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)


_SKIP, _HEX, _INT, _FLOAT = 0, 1, 2, 3  # how the scan reads a slot's cells


@numba.njit(nogil=True, cache=True)
def _scan(buf, delimiter, slot_of, modes, columns, starts, ends, values, numbers, other, widths, ascii_, bounds):
    """Fill the arrays (see scan_plain) from buf: len(columns) lines, each ending in NEWLINE."""
    s = 0
    for i in range(len(columns)):
        bounds[i] = s
        j = 0
        if buf[s] == _NL:  # an empty line: no cell
            columns[i] = 0
            s += 1
            continue
        while True:
            e = s
            while buf[e] != delimiter and buf[e] != _NL:
                e += 1
            if j < len(slot_of) and slot_of[j] >= 0:
                k = slot_of[j]
                starts[i, k], ends[i, k] = s, e
                if k > 0:
                    w = e - s
                    if not ascii_:
                        for p in range(s, e):
                            w -= (buf[p] & 0xC0) == 0x80  # UTF-8 continuation bytes are no characters
                    widths[i] = max(widths[i], w)
                if modes[k] == _HEX:
                    ok, v = hex_cell(buf, s, e)
                    values[i, k] = v
                    other[i, k] = not ok
                elif modes[k] == _INT:
                    ok, v = int_cell(buf, s, e)
                    values[i, k] = v
                    other[i, k] = not ok
                elif modes[k] == _FLOAT:
                    ok, x = float_cell(buf, s, e)
                    numbers[i, k] = x
                    other[i, k] = not ok
            j += 1
            last = buf[e] == _NL
            s = e + 1
            if last:
                break
        columns[i] = j
    bounds[len(columns)] = s
