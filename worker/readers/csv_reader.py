"""The CSV reader: a worker's share of a CSV file's records as chunks of cells (worker/formats.py reads them).

csv     A header line names the columns (the csv module's dialect with the schema's delimiter, double-quote
        quoting; UTF-8, a leading BOM ignored), each cell with the spaces around it left out (`id, clicked`
        names `clicked`; the readers refuse two cells that differ only so, `a` and ` a`: header_names, which
        the delimiter probe does not call); the schema's sources and label must each be in it once. The
        label column (the built-in schema's: schema_builtin.csv_label) holds 0 or 1: any text that float() reads
        as 0 or 1, or true, false, yes or no in any case, surrounding whitespace allowed (csv_fast.label_value).
        Bad: a column count other than the header's, a bad label (a record equal to the header, as a
        concatenation of files repeats it, is named as such; blank_labels: any other label cell is no label,
        NaN, worker/formats.py's "Blank labels"). A chunk is read by worker/csv_fast.py's
        compiled scan when its lines are plain (no quote, NUL or lone CR; UTF-8), else by the csv module
        (with the same result).
Empty: a file of no content (share.is_blank: no bytes, or whitespace only) holds no records and no header; a
        record whose every cell is blank (a spreadsheet's empty row: ",,,"; a quoted cell of whitespace or line
        ends only, whose record spans lines) is an empty line, skipped, never a malformed one.
Without labels: the header has no column named as the schema's label; the other rules hold. has_labels tells
        by the header: one naming the label column (a schema without a label takes the first column: always
        labeled).
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.cells import is_missing_text
from worker.criteo import BLANK_CELLS, EMPTY_LINE
from worker.csv_fast import BOOL_LABELS, CsvLines, Plain, Scanned, label_value, scan_plain
from worker.encode import Parsed, parsed_sources
from worker.readers.share import Cells, ReadStats, Share, is_blank, open_data
from worker.schema import Schema
from worker.schema_columns import is_label_name, labels_by_name

CSV_SCAN = True  # csv runs of plain lines through csv_fast.scan_plain first; False: the csv module alone
MAX_CSV_FIELD = 1 << 30  # the csv module's default limit (128 KiB) would turn a long bag cell into a bad line
CHUNK_CHARS = 1 << 22  # rows x longest cell of a CSV chunk at most (one row alone may pass it): numpy's string
# arrays pad every cell to the longest, 4 bytes a character, so one 100 KB cell among 4,096 rows took 1.6 GB a column
MAX_RECORD_LINES = 100  # physical lines of one CSV record at most: more is a quote left open (BoundedReader)
DELIMITERS = (",", "\t", ";", "|")  # the delimiters --format auto tells (csv_dialect), and a one-column header's
# hint names (_delimiter_hint)


def delimiter_name(delimiter: str) -> str:
    """How messages name a delimiter: comma, tab, ';'."""
    return {",": "comma", "\t": "tab"}.get(delimiter, repr(delimiter))


class RecordTooLongError(csv.Error):
    """A CSV record cut at MAX_RECORD_LINES physical lines (BoundedReader)."""


class BoundedReader:
    """A csv.reader over lines (an iterable of text lines with their line ends) whose records span at most
    MAX_RECORD_LINES physical lines. A quote left open makes the csv module read every line after it into one
    field, up to MAX_CSV_FIELD characters (a 600 MB file took 3 GB of memory for one stray quote): here the
    record is cut there and raises RecordTooLongError, a csv.Error like any unreadable record, and the next
    record starts on the line after (the csv module starts each record afresh)."""

    def __init__(self, lines: Iterable[str], delimiter: str):
        csv.field_size_limit(MAX_CSV_FIELD)  # long bag cells are read (then cut to max_length), not bad lines
        self._lines = iter(lines)
        self._taken = 0  # lines read so far
        self._start = 0  # lines read before the record being read
        # iter(callable, sentinel) ends at the lines' StopIteration; _RecordCut goes through the csv module
        self._reader = csv.reader(iter(self._line, None), delimiter=delimiter)

    def __iter__(self) -> BoundedReader:
        return self

    @property
    def record_line(self) -> int:
        """The line, from 1, of the lines given, that the record read last starts on."""
        return self._start + 1

    def __next__(self) -> list[str]:
        self._start = self._taken
        try:
            return next(self._reader)
        except _RecordCut:
            raise RecordTooLongError(f"a record of more than {MAX_RECORD_LINES} lines, cut there") from None

    def _line(self) -> str:
        if self._taken - self._start >= MAX_RECORD_LINES:
            raise _RecordCut
        line = next(self._lines)  # StopIteration: the end of the lines
        self._taken += 1
        return line


class _RecordCut(Exception):
    """Raised through the csv module by BoundedReader's lines, to end a record."""


class open_csv:
    """A context manager giving a csv reader (BoundedReader) over a file (gzip read through), UTF-8 with a BOM
    ignored; raw: the file in bytes."""

    def __init__(self, name: str, delimiter: str):
        self.raw = open_data(name)
        text = io.TextIOWrapper(self.raw, encoding="utf-8-sig", errors="surrogateescape", newline="")
        self.reader = BoundedReader(text, delimiter)

    def __enter__(self) -> Any:  # the csv.reader
        return self.reader

    def __exit__(self, *exc: object) -> None:
        self.raw.close()


def read_csv_header(path: str | os.PathLike, delimiter: str) -> list[str] | None:
    """The header's column names of a csv file (header_names: refused where two cells differ only by the spaces
    around them), or None for a file of no content (share.is_blank: empty, or whitespace only)."""
    cells = read_header_cells(path, delimiter)
    return None if cells is None else header_names(os.fspath(path), cells)


def read_header_cells(path: str | os.PathLike, delimiter: str) -> list[str] | None:
    """The header line's cells of a csv file as the file writes them, the spaces around them kept, or None for a
    file of no content (share.is_blank: empty, or whitespace only). Nothing is refused: the delimiter probe
    (csv_dialect) reads every candidate's cells so, and the readers that use the names check them (header_names)."""
    name = os.fspath(path)
    if is_blank(name):
        return None
    with open_csv(name, delimiter) as reader:
        return next(reader, None)


def header_names(name: str, cells: list[str]) -> list[str]:
    """The column names of the header line of file `name` (cells: as the csv module reads them): each cell with the
    spaces around it left out, or ValueError where two cells that differ so name one column (` a` and `a`; two
    cells written alike stay two of one name, refused where a column reads them: header_positions)."""
    names = [c.strip() for c in cells]
    written: dict[str, str] = {}
    for cell, n in zip(cells, names):
        if n and written.setdefault(n, cell) != cell:
            raise ValueError(f"{name}: the header's cells {written[n]!r} and {cell!r} both name column {n!r} (the "
                             "spaces around a name are no part of it): rename one of them")  # fmt: skip
    return names


def column_cells(name: str, delimiter: str, columns: list[str]) -> Iterator[tuple[int, list[str]]]:
    """(first physical line, cells of columns) of each record of a csv file past its header, in file order and
    numbered as csv_cells numbers them (the header is line 1), the cells as the csv module reads them; a record of
    another width than the header's, or one the csv module cannot read (bad lines, to csv_cells), gives none. The
    header must hold each of the columns once (header_positions' ValueError otherwise)."""
    with open_data(name) as raw:
        lines = CsvLines(raw)
        reader = BoundedReader(lines.texts(), delimiter)
        header = header_names(name, next(reader, None) or [])
        at = header_positions(name, header, columns, delimiter)
        while True:
            start = lines.consumed + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error:
                continue
            if len(row) == len(header):
                yield start, [row[i] for i in at]


@dataclass(frozen=True)
class CsvDataPlaces:
    """Where a csv file's records of data (_records_hold_data) stand among its records past the header: residues,
    the residues mod a modulus of their 0-based indices (where a worker's share, every modulus-th record, records of
    no data included, finds data); records and data, its records and of them those of data, where the read went to
    the end (some residue not found), else None."""

    residues: frozenset[int]
    records: int | None
    data: int | None


def csv_data_places(name: str, delimiter: str, modulus: int) -> CsvDataPlaces:
    """CsvDataPlaces of a csv file, read once, until every residue mod `modulus` is found (then without the counts)
    or to its end; no residue and no record for a file of no content."""
    found: set[int] = set()
    records = data = 0
    for records, holds_data in enumerate(_records_hold_data(name, delimiter), start=1):
        if holds_data:
            data += 1
            found.add((records - 1) % modulus)
            if len(found) == modulus:
                return CsvDataPlaces(frozenset(found), None, None)
    return CsvDataPlaces(frozenset(found), records, data)


def _records_hold_data(name: str, delimiter: str) -> Iterator[bool]:
    """Whether each record of a csv file past its header holds data, in file order: the records split as csv_cells
    splits them (BoundedReader: a quoted field may span lines), one of data when the csv module reads it and some
    cell of it is not blank (not a blank line or a row of blank cells, ",,,", which the reader skips as empty;
    nor a record it cannot read). Nothing for a file of no content. The places of a worker's share are these records,
    those of no data included."""
    with open_data(name) as raw:
        reader = BoundedReader(CsvLines(raw).texts(), delimiter)
        if _header_record(reader, name) is None:
            return
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error:
                yield False
                continue
            yield not _blank_record(row)


def _header_record(reader: BoundedReader, name: str) -> list[str] | None:
    """The first record of file `name` read from `reader`, its header; None for a file of no content (no record,
    or a blank first record of a file that share.is_blank finds empty or whitespace only)."""
    header = next(reader, None)
    if header is None or (not "".join(header).strip() and is_blank(name)):
        return None
    return header


def has_labels(name: str, schema: Schema) -> bool:
    """Whether a CSV file holds labels (see the module docstring); True for an empty file."""
    header = read_csv_header(name, schema.delimiter)
    return not header or schema.label is None or schema.label in header


@dataclass(frozen=True)
class _Label:
    """The label column of a header as a file is read: at, its index (None: no label read), name, and origin,
    where the schema took it (Schema.label_from); problem() says what is wrong with a bad label."""

    at: int | None
    name: str | None
    origin: str
    header: list[str]
    blank_ok: bool = False  # a label cell other than 0 or 1 is no label, NaN (predict; but a repeated header's)

    def good(self, cell: str) -> bool:
        """Whether a label cell is a label (0 or 1), or, blank_ok, a blank one (empty, or NA, ?:
        cells.MISSING_TEXTS)."""
        return label_value(cell) in (0.0, 1.0) or (self.blank_ok and (not cell.strip() or is_missing_text(cell)))

    def unread(self, row: list[str]) -> bool:
        """Whether a record (row: its cells) whose label cell is not good is read all the same, its label NaN:
        blank_ok, and not a repeated header (predict reads no label: a row of good features is scored)."""
        return self.blank_ok and not self._repeated_header(row)

    def _repeated_header(self, row: list[str]) -> bool:
        return [c.strip() for c in ([row[0].removeprefix("\ufeff"), *row[1:]] if row else row)] == self.header

    def problem(self, cell: str, row: list[str]) -> str:
        """Why a record (row: its cells) whose label cell is `cell` is bad."""
        if self._repeated_header(row):
            return "a repeated header line (files concatenated?)"
        what = f"label {cell!r}" if cell.strip() else "an empty label"
        if self.origin in ("schema", "--label-column"):
            given = "the schema's label" if self.origin == "schema" else "given by --label-column"
            return f"{what}, expected 0 or 1 (column {self.name!r}, {given}){_other_coding(cell)}"
        if self.origin != "first column":  # a column the built-in schema took for its name (schema_builtin.csv_label)
            return (f"{what}, expected 0 or 1 (column {self.name!r}, {self.origin}: --label-column or the schema's "
                    f"`label` names another){_other_coding(cell)}")  # fmt: skip
        if is_label_name(self.name) and _other_coding(cell):  # the label it is, its values written otherwise
            return f"{what}, expected 0 or 1 (column {self.name!r}, the first column){_other_coding(cell)}"
        named = labels_by_name([h for h in self.header if h != self.name])
        hint = f"; the header has {named[0]!r}: --label-column {named[0]}?" if len(named) == 1 else ""
        if len(named) > 1:
            shown = ", ".join(map(repr, named[:-1])) + f" and {named[-1]!r}"
            hint = f"; the header has {shown}, named like a label: --label-column names the one to predict"
        return (f"{what}, expected 0 or 1 (column {self.name!r}, the first column, the built-in default: "
                f"--label-column or the schema's `label` names another{hint})")  # fmt: skip


def _other_coding(cell: str) -> str:
    """For a label cell of the label column that is -1 or a word (not a missing value's text), as labels coded -1
    and 1, or with words other than label_value's (clicked and not), are: how to write them; else ""."""
    value = label_value(cell)
    if value != -1 and not (math.isnan(value) and cell.strip() and not is_missing_text(cell)):
        return ""
    return (": rewrite the column as 1 for the outcome the model predicts and 0 for the other (" + BOOL_LABELS +
            " are read as 1 and 0 too)")  # fmt: skip


def _delimiter_hint(header: list[str], delimiter: str) -> str:
    """A hint for a header read as one column that another delimiter would split, else ""."""
    if len(header) != 1:
        return ""
    for other in DELIMITERS:
        if other != delimiter and other in header[0]:
            return (f" (the header looks {delimiter_name(other)}-separated: --format auto tells a header's delimiter, "
                    "a schema's `delimiter` names it)")  # fmt: skip
    return ""


def _csv_columns(name: str, header: list[str], schema: Schema, labeled: bool = True, blank_ok: bool = False
                 ) -> tuple[_Label, dict[str, int]]:  # fmt: skip
    """(the label column, {source: index}) of a header, or ValueError naming what the schema needs that it lacks;
    labeled=False: no label is read (index None); blank_ok: a blank label cell is no label (_Label)."""
    if not header:
        raise ValueError(f"{name}: the header line names no columns")
    label = schema.label if schema.label is not None else (header[0] if header else None)
    sources = list(dict.fromkeys(c.source for c in schema.columns))
    if not labeled:
        label = None
    named = [label, *sources] if labeled else sources
    at = header_positions(name, header, named, schema.delimiter)
    if label in sources:
        raise ValueError(f"{name}: column {label!r} is the label (the first column) and a column of the schema")
    origin = schema.label_from if schema.label is not None else "first column"
    label_at = at.pop(0) if labeled else None
    return _Label(label_at, label, origin, header, blank_ok), dict(zip(sources, at))


def header_positions(name: str, header: list[str], columns: list[str], delimiter: str) -> list[int]:
    """The position in the header of file `name` of each of columns, or ValueError naming those it lacks (with
    _delimiter_hint's hint) or names more than once."""
    unknown = [c for c in columns if c not in header]
    if unknown:
        raise ValueError(f"{name}: columns {unknown} are not in the header; its columns are {header}"
                         f"{_delimiter_hint(header, delimiter)}")  # fmt: skip
    repeated = [c for c in columns if header.count(c) > 1]
    if repeated:
        raise ValueError(f"{name}: columns {repeated} appear more than once in the header {header}")
    return [header.index(c) for c in columns]


def csv_cells(name: str, schema: Schema, size: int, share: Share, labeled: bool = True,
              blank_labels: bool = False) -> Iterator[Cells]:  # fmt: skip
    """Chunks of `size` records of the share (labeled=False: without labels; blank_labels: a blank label cell is
    no label, NaN): through csv_fast's scan when
    CSV_SCAN allows it and all of the chunk's lines are plain and UTF-8, else through the csv module (the lines
    of the run taken before the first that is not, each read from its text; then records from there on)."""
    with open_data(name) as raw:
        lines = CsvLines(raw)
        reader = BoundedReader(lines.texts(), schema.delimiter)
        header = _header_record(reader, name)
        if header is None:
            return
        header = header_names(name, header)
        share.bad.stats.headers += 1
        label, sources = _csv_columns(name, header, schema, labeled, blank_labels)
        parsed = parsed_sources(schema)
        scan = CSV_SCAN and ord(schema.delimiter) < 128
        n, index = share.num_workers, 0  # index: the records read so far
        while True:
            chunk = _CsvRecords(share.bad.stats, len(header), label)
            if scan:
                base = lines.consumed
                plain = lines.take_plain(share.worker_id, n, index, size)
                index += plain.lines
                line_nos = base + 1 + plain.first + n * np.arange(plain.count, dtype=np.int64)
                if not plain.stopped and _utf8(plain):
                    share.bad.stats.lines_read += plain.count
                    if plain.count:
                        scanned = scan_plain(plain, schema.delimiter, len(header), label.at, sources, parsed)
                        yield from _scanned_chunks(scanned, line_nos, len(header), label, schema.delimiter)
                    if plain.count < size:  # the end of the file
                        return
                    continue
                text = plain.buf.tobytes().decode("utf-8", "surrogateescape").split("\n")[:-1]
                for row, line_no in zip(csv.reader(text, delimiter=schema.delimiter), line_nos.tolist()):
                    chunk.add(row, line_no, line_no)
            ended = False
            while chunk.lines < size:
                start = lines.consumed + 1  # the record's first physical line
                try:
                    row = next(reader)
                except StopIteration:
                    ended = True
                    break
                except csv.Error as e:  # e.g. a field over the csv module's size limit
                    row = e
                index += 1
                if (index - 1) % n == share.worker_id:
                    chunk.add(row, start, lines.consumed)
            if chunk.lines:
                yield from _csv_chunks(chunk.labels, chunk.rows, chunk.line_nos, chunk.problems, sources, chunk.unread)
            if ended:
                return


def _utf8(plain: Plain) -> bool:
    """Whether a run's lines are UTF-8: the scan's cells are decoded as UTF-8 (csv_fast's _LazyCells), so a run
    with other bytes goes through the csv module, whose text keeps them as surrogate escapes (hashed as those
    bytes, as the scan hashes them: features.cat_values)."""
    if plain.ascii:
        return True
    try:
        plain.buf.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class _CsvRecords:
    """A chunk's records as the csv module reads them: the good ones' labels, rows and first lines; problems."""

    def __init__(self, stats: ReadStats, width: int, label: _Label):
        self.stats, self.width, self.label = stats, width, label
        self.labels: list[float] = []
        self.rows: list[list[str]] = []
        self.line_nos: list[int] = []
        self.problems: list[tuple] = []
        self.unread: dict[int, str] = {}  # of the good records: the label cells read as no label (_Label.unread)
        self.lines = 0  # records of the chunk, bad ones included

    def add(self, row: list[str] | csv.Error, start: int, end: int) -> None:
        """A record of physical lines start..end (at most MAX_RECORD_LINES: BoundedReader cuts a longer one, an
        unreadable record). A blank one (a quoted cell of line ends only, "\\n") is skipped as one empty line, as a
        good one is read as one line."""
        self.stats.lines_read += 1
        self.lines += 1
        problem = _csv_problem(row, self.width, self.label)
        blank = problem in (EMPTY_LINE, BLANK_CELLS)  # skipped as one empty line, over one line or several
        if problem is not None and not blank and end > start:  # a bad record over several lines: each is lost
            self.stats.lines_read += end - start
            spans = f" (a record from line {start} to line {end}: a quoted field spans them; a stray quote?)"
            self.problems.append((start, problem + spans, end - start + 1))
        elif problem is not None:
            self.problems.append((start, problem))
        else:
            cell = None if self.label.at is None else row[self.label.at]
            unread = cell is not None and not self.label.good(cell)
            self.labels.append(math.nan if cell is None or unread else label_value(cell))
            if unread:
                self.unread[start] = cell
            self.rows.append(row)  # blank: NaN too (label_value's)
            self.line_nos.append(start)


def _scanned_chunks(scanned: Scanned, line_nos: np.ndarray, width: int, label: _Label, delimiter: str
                    ) -> Iterator[Cells]:  # fmt: skip
    """The chunk of a scanned run (the rules of _csv_problem), cut as _csv_chunks cuts."""
    columns, problems, unread = scanned.columns, [], {}
    bad = columns != width
    if label.at is None:  # a blank line may be whole: found in one pass
        blank = scanned.blank(delimiter)
    else:  # a blank line has a bad label or column count: those few lines are looked at
        blank = np.zeros(len(columns), dtype=bool)
        for i in np.flatnonzero(bad | ((scanned.labels != 0) & (scanned.labels != 1))).tolist():
            blank[i] = columns[i] == 0 or _blank(scanned.line(i), delimiter)
    for i in np.flatnonzero(bad | blank).tolist():
        if blank[i] or columns[i] == 0:  # of one cell at most: a blank line; of more, blank cells
            problems.append((int(line_nos[i]), EMPTY_LINE if columns[i] <= 1 else BLANK_CELLS))
        else:
            problems.append((int(line_nos[i]), f"{columns[i]} columns, expected {width} as in the header"))
    bad |= blank
    if label.at is not None:
        bad_label = ~bad & (scanned.labels != 0) & (scanned.labels != 1)
        if label.blank_ok:  # those few cells looked at
            for i in np.flatnonzero(bad_label).tolist():
                cell = scanned.label(i)
                good = label.good(cell)
                if not good and label.unread(scanned.line(i).split(delimiter)):
                    unread[int(line_nos[i])] = cell
                bad_label[i] = not good and int(line_nos[i]) not in unread
                if not bad_label[i]:
                    scanned.labels[i] = np.nan
        problems += [(int(line_nos[i]), label.problem(scanned.label(i), scanned.line(i).split(delimiter)))
                     for i in np.flatnonzero(bad_label)]  # fmt: skip
        bad |= bad_label
    problems.sort()
    good = np.flatnonzero(~bad)
    labels, line_nos, widths = scanned.labels[good].astype(np.float32), line_nos[good], scanned.widths[good]
    cells, cats = scanned.cells.rows(good), {s: v[good] for s, v in scanned.cats.items()}
    ints = {s: v[good] for s, (v, simple) in scanned.ints.items() if simple[good].all()}  # else encode reads them
    floats = {s: (v[good], m[good]) for s, (v, m, simple) in scanned.floats.items() if simple[good].all()}
    bounds = _cut_bounds(widths.tolist()) if len(good) and int(widths.max()) * len(good) > CHUNK_CHARS else None
    bounds = bounds or [0, len(good)]
    for a, b in itertools.pairwise(bounds):
        mine = _piece_problems(problems, line_nos.tolist(), a, b)
        piece = cells.rows(slice(a, b)) if len(bounds) > 2 else cells
        part = Parsed({s: v[a:b] for s, v in ints.items()}, {s: v[a:b] for s, v in cats.items()},
                      {s: (v[a:b], m[a:b]) for s, (v, m) in floats.items()})  # fmt: skip
        yield Cells(labels[a:b], piece, line_nos[a:b], mine, part, unread)


def _csv_chunks(
    labels: list[float], rows: list[list[str]], line_nos: list[int], problems: list, sources: dict,
    unread: dict[int, str],
) -> Iterator[Cells]:  # fmt: skip
    """The chunk of these records, cut where rows x the longest cell read would pass CHUNK_CHARS (each piece
    with the problems of the lines before the next piece); unread: Cells.unread_labels."""
    columns = {s: [r[i] for r in rows] for s, i in sources.items()}
    if not rows or max((max(map(len, c)) for c in columns.values()), default=0) * len(rows) <= CHUNK_CHARS:
        yield _csv_chunk(labels, columns, line_nos, problems, unread)
        return
    bounds = _cut_bounds([max(w) for w in zip(*(map(len, c) for c in columns.values()))])
    for a, b in itertools.pairwise(bounds):
        mine = _piece_problems(problems, line_nos, a, b)
        yield _csv_chunk(labels[a:b], {s: c[a:b] for s, c in columns.items()}, line_nos[a:b], mine, unread)


def _cut_bounds(widths: list[int]) -> list[int]:
    """[0, cuts..., len(widths)]: rows cut into pieces where rows x the longest cell would pass CHUNK_CHARS."""
    cuts, longest, first = [], 0, 0
    for k, w in enumerate(widths):
        if k > first and max(longest, w) * (k - first + 1) > CHUNK_CHARS:
            cuts.append(k)
            first, longest = k, 0
        longest = max(longest, w)
    return [0, *cuts, len(widths)]


def _piece_problems(problems: list, line_nos: list[int], a: int, b: int) -> list:
    """The problems of the piece of rows a:b of a chunk: those of the lines before row b's (all, for the last
    piece) and from row a's on (all, for the first)."""
    last = b == len(line_nos)
    return [p for p in problems if (last or p[0] < line_nos[b]) and (a == 0 or p[0] >= line_nos[a])]


def _csv_chunk(labels: list[float], columns: dict[str, list[str]], line_nos: list[int], problems: list,
               unread: dict[int, str]) -> Cells:  # fmt: skip
    cells = {s: np.array(c, dtype=np.str_) for s, c in columns.items()}
    return Cells(np.array(labels, dtype=np.float32), cells, np.array(line_nos, dtype=np.int64), problems, None, unread)


def _blank(line: str, delimiter: str) -> bool:
    """Whether a line holds nothing but the delimiter and whitespace."""
    return not line.replace(delimiter, "").strip()


def _blank_record(row: list[str]) -> bool:
    """Whether a record is empty to the reader: no cell, or only blank ones (a blank line, ",,,")."""
    return not any(cell.strip() for cell in row)


def _csv_problem(row: list[str] | csv.Error, width: int, label: _Label) -> str | None:
    """What is wrong with a record (label.at None: it has no label), or None."""
    if isinstance(row, csv.Error):
        return f"unreadable CSV: {row}"
    if _blank_record(row):  # no cell or one blank (a blank line), or blank cells
        return EMPTY_LINE if len(row) <= 1 else BLANK_CELLS
    if len(row) != width:
        return f"{len(row)} columns, expected {width} as in the header"
    if label.at is None or label.good(row[label.at]) or label.unread(row):
        return None
    return label.problem(row[label.at], row)
