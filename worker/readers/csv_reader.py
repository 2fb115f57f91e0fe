"""The CSV reader: a worker's share of a CSV file's records as chunks of cells (worker/formats.py reads them).

csv     A header line names the columns (the csv module's dialect with the schema's delimiter, double-quote
        quoting; UTF-8, a leading BOM ignored), each cell with the spaces around it left out (`id, clicked`
        names `clicked`; the readers refuse two cells that differ only so, `a` and ` a`: csv_header.header_names,
        which the delimiter probe does not call); the schema's sources and label must each be in it once. The
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
The header's names and label column are read by csv_header.py; the records, each at most MAX_RECORD_LINES physical
lines, by csv_records.py; here they are cut into chunks of cells.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Iterator

import numpy as np

from worker.criteo import BLANK_CELLS, EMPTY_LINE
from worker.csv_fast import CsvLines, Plain, Scanned, label_value, scan_plain
from worker.encode import Parsed, parsed_sources
from worker.readers.csv_header import LabelColumn, csv_columns, header_names
from worker.readers.csv_records import BoundedReader, blank_record, header_record, read_csv_header
from worker.readers.share import Cells, ReadStats, Share, open_data
from worker.schema import Schema

CSV_SCAN = True  # csv runs of plain lines through csv_fast.scan_plain first; False: the csv module alone
CHUNK_CHARS = 1 << 22  # rows x longest cell of a CSV chunk at most (one row alone may pass it): numpy's string
# arrays pad every cell to the longest, 4 bytes a character, so one 100 KB cell among 4,096 rows took 1.6 GB a column


def has_labels(name: str, schema: Schema) -> bool:
    """Whether a CSV file holds labels (see the module docstring); True for an empty file."""
    header = read_csv_header(name, schema.delimiter)
    return not header or schema.label is None or schema.label in header


def csv_cells(name: str, schema: Schema, size: int, share: Share, labeled: bool = True,
              blank_labels: bool = False) -> Iterator[Cells]:  # fmt: skip
    """Chunks of `size` records of the share (labeled=False: without labels; blank_labels: a blank label cell is
    no label, NaN): through csv_fast's scan when
    CSV_SCAN allows it and all of the chunk's lines are plain and UTF-8, else through the csv module (the lines
    of the run taken before the first that is not, each read from its text; then records from there on)."""
    with open_data(name) as raw:
        lines = CsvLines(raw)
        reader = BoundedReader(lines.texts(), schema.delimiter)
        header = header_record(reader, name)
        if header is None:
            return
        header = header_names(name, header)
        share.bad.stats.headers += 1
        label, sources = csv_columns(name, header, schema, labeled, blank_labels)
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

    def __init__(self, stats: ReadStats, width: int, label: LabelColumn):
        self.stats, self.width, self.label = stats, width, label
        self.labels: list[float] = []
        self.rows: list[list[str]] = []
        self.line_nos: list[int] = []
        self.problems: list[tuple] = []
        self.unread: dict[int, str] = {}  # of the good records: the label cells read as no label (LabelColumn.unread)
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


def _scanned_chunks(scanned: Scanned, line_nos: np.ndarray, width: int, label: LabelColumn, delimiter: str
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


def _csv_problem(row: list[str] | csv.Error, width: int, label: LabelColumn) -> str | None:
    """What is wrong with a record (label.at None: it has no label), or None."""
    if isinstance(row, csv.Error):
        return f"unreadable CSV: {row}"
    if blank_record(row):  # no cell or one blank (a blank line), or blank cells
        return EMPTY_LINE if len(row) <= 1 else BLANK_CELLS
    if len(row) != width:
        return f"{len(row)} columns, expected {width} as in the header"
    if label.at is None or label.good(row[label.at]) or label.unread(row):
        return None
    return label.problem(row[label.at], row)
