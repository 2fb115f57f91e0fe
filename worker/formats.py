"""Training data in three formats, read through a schema into Batches: Criteo TSV, CSV with a header, libsvm.

    read_batches(path, schema, batch_size, *, worker_id=0, num_workers=1, max_bad_lines=0, stats=None,
                 labeled=True) -> Iterator[Batch]
    file_has_labels(path, schema) -> bool       # whether a file to score holds labels (see "Files without labels")
    column_stats(path, schema) -> {column name: (mean, std)}   # of the schema's standardize columns
    check_same_format(path, schema)             # ValueError naming the first file unlike the first one
    read_csv_header(path, delimiter), read_csv_sample(path, delimiter, rows), libsvm_field_count(path)

A format (schema.format) splits each data line into a label and named cells; worker/encode.py turns the cells
into the Batch's ids and numeric features as the schema says.

Common to all formats:
  - A path ending in ".gz" is read through gzip.
  - Data lines are numbered from 0, the CSV header excluded (for CSV a "line" is a record, which may span
    several physical lines inside quotes; a bad record that does counts each of its lines as a bad line, so that
    a stray quote, which runs a record to the end of the file, cannot lose the rest of it as one bad line).
    Worker i of n reads the data lines whose number % n == i, so n workers together read every line exactly once.
  - `path` may name many files (worker/datafiles.py: a directory, a glob, a comma-separated list), read in order
    as one stream: batches run on across files, and bad lines count against max_bad_lines over the stream, each
    named by its own file and line. Worker i reads, of the k-th file (from 0), the lines whose number % n ==
    (i + k) % n: still every line exactly once, and small files spread over the workers rather than all to worker
    0. check_same_format refuses files that differ in format from the first.
  - An empty data line (nothing but whitespace, as spreadsheet exports often end with) is skipped and counted
    in stats.empty_lines, not as a bad line.
  - A malformed data line is skipped and counted in `stats` (ReadStats): one the
    format cannot split (the problems listed below), or one with a cell the schema cannot read (encode.py: a
    numeric cell that is not a number, an integer column that is not an int64 integer, a bag token that is
    not id:weight, a raw id that is not a decimal). A worker counts only the bad lines of its share; when its
    count exceeds max_bad_lines the reader raises ValueError
    "<file> line <L>: <problem>; <k> bad lines, more than --max-bad-lines <max>", L the 1-based physical line
    of the bad line that crossed the limit. Bad lines are counted in file order.
  - Batches hold batch_size good examples each (the last may hold fewer), in file order; probs is None;
    line_nos holds each example's 1-based physical line (a CSV record's first line; the header is line 1).
    Bags cut to their column's max_length are counted in stats.truncated_bags.

Formats (the columns a schema's sources name):
  criteo  label TAB I1..I13 TAB C1..C26 (worker/criteo.py): columns I1..I13, C1..C26. Bad: a column count
          other than 40, a label other than 0/1. A chunk is read by worker/criteo_fast.py's compiled scan, or
          when it holds a line the scan does not handle, by criteo.parse_share (with the same result).
  csv     A header line names the columns (the csv module's dialect with the schema's delimiter, double-quote
          quoting; UTF-8, a leading BOM ignored); the schema's sources and label must each be in it once. The
          label column (default: the first) holds 0 or 1 (any text that float() reads as 0 or 1).
          Bad: a column count other than the header's, a bad label. A chunk is read by worker/csv_fast.py's
          compiled scan when its lines are plain (no quote, NUL or lone CR; UTF-8), else by the csv module
          (with the same result).
  libsvm  label id:value id:value ...   (whitespace-separated). Labels 0 or 1, or -1 (-> 0) or +1 (-> 1).
          Column f<k> holds the id of the k-th feature token, written in hex (so a hashed categorical column's
          value is the id itself), or is empty when the token's value is 0 (missing: CTR libsvm data is
          one-hot, any other finite value is ignored). K = 1 + the largest k among the schema's columns (0
          without any): a line with fewer than K features has empty cells in its last columns; one with more
          is a bad line. Ids are integers 0 <= id < 2**64 - 1, written as decimal digits.
          Bad: a bad label, a token other than id:value, more than K features.

Files without labels (read_batches labeled=False; only `ps-worker predict` reads them, training and eval
always read with labels, and refuse such a file's lines as bad): every example's label is NaN, and
  criteo  I1..I13 TAB C1..C26: 39 columns. Bad: a column count other than 39.
  csv     the header has no column named as the schema's label; the other rules hold.
  libsvm  id:value id:value ...: every token a feature. Bad: a token other than id:value, more than K features.
file_has_labels tells them apart by the file's start: a csv header naming the label column (a schema without a
label takes the first column: always labeled); a criteo file is unlabeled when the first of its first
LABEL_PROBE_LINES lines with 39 or 40 columns has 39; a libsvm file when the first of them whose first token is
id:value (a non-negative integer id) or has no ":" (a label) is the former. libsvm_field_count counts the
features of such a file's lines the same way.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import math
import os
import re
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from worker.batch import Batch, rebatch
from worker.criteo import EMPTY_LINE, NUM_COLUMNS, hex_strings, parse_share
from worker.criteo_fast import scan_lines
from worker.csv_fast import CsvLines, Plain, Scanned, scan_plain
from worker.datafiles import data_files
from worker.encode import Parsed, encode_examples, float_values, parsed_sources
from worker.features import MISSING_CAT
from worker.schema import CRITEO_COLUMNS, LIBSVM_COLUMN, Schema

_MISSING = int(MISSING_CAT)
_MIN_CHUNK = 4096  # lines split and encoded at a time, at least (per-column costs are paid once a chunk)
CRITEO_SCAN = True  # criteo chunks through criteo_fast.scan_lines first; False: criteo.parse_share alone
CSV_SCAN = True  # csv runs of plain lines through csv_fast.scan_plain first; False: the csv module alone


@dataclass
class ReadStats:
    """Filled in by read_batches as it reads (after each chunk of max(batch_size, 4096) lines it splits)."""

    lines_read: int = 0  # data lines of this worker's share read so far, bad ones included
    bad_lines: int = 0  # of which malformed (skipped)
    empty_lines: int = 0  # of which empty (skipped, not bad)
    first_bad: str | None = None  # the first problem: "<file> line <L>: <what was wrong>"
    truncated_bags: int = 0  # bags of the good lines cut to their column's max_length


def read_batches(
    path: str | os.PathLike,
    schema: Schema,
    batch_size: int,
    *,
    worker_id: int = 0,
    num_workers: int = 1,
    max_bad_lines: int = 0,
    stats: ReadStats | None = None,
    labeled: bool = True,
) -> Iterator[Batch]:
    """Batches of this worker's share of the file (see the module docstring; labeled=False: a file without
    labels). Arguments are checked here; the file (and a CSV header against the schema) when iteration starts."""
    if batch_size < 1:
        raise ValueError(f"batch_size is {batch_size}, expected >= 1")
    if num_workers < 1 or not 0 <= worker_id < num_workers:
        raise ValueError(f"worker_id {worker_id} of num_workers {num_workers}: expected 0 <= worker_id < num_workers")
    if max_bad_lines < 0:
        raise ValueError(f"max_bad_lines is {max_bad_lines}, expected >= 0")
    if schema.needs_stats():
        raise ValueError("the schema has standardize columns without mean and std: column_stats and with_stats")
    files = data_files(path)
    stats = stats if stats is not None else ReadStats()

    def stream() -> Iterator[Batch]:
        for k, name in enumerate(files):  # file k's share: its lines whose number % n == (worker_id + k) % n
            share = _Share((worker_id + k) % num_workers, num_workers, _BadLines(name, max_bad_lines, stats))
            yield from _encoded(name, schema, batch_size, share, labeled)

    return rebatch(stream(), batch_size)


def column_stats(path: str | os.PathLike, schema: Schema) -> dict[str, tuple[float, float]]:
    """{name: (mean, std)} of every standardize column: of its present raw values over the good lines of the
    whole file (std of the population; (0, 1) for a column with no value), in one pass."""
    columns = [c for c in schema.dense_columns() if c.transform == "standardize"]
    if not columns:
        return {}
    placeholder = schema.with_stats({c.name: (0.0, 1.0) for c in columns})  # to find the bad lines
    moments = {c.name: (0, 0.0, 0.0) for c in columns}  # count, mean, sum of squared deviations
    for chunk in itertools.chain.from_iterable(
        _cell_chunks(name, placeholder, _MIN_CHUNK, _Share(0, 1, _BadLines(name, sys.maxsize, ReadStats())))
        for name in data_files(path)
    ):
        good = np.ones(len(chunk.labels), dtype=bool)
        good[encode_examples(placeholder, chunk.labels, chunk.cells, chunk.parsed).bad] = False
        for c in columns:
            x, missing, _ = float_values(chunk.cells[c.source])
            moments[c.name] = _merge(moments[c.name], x[good & ~missing])
    return {k: (mean, math.sqrt(m2 / count)) if count else (0.0, 1.0) for k, (count, mean, m2) in moments.items()}


def _merge(a: tuple[int, float, float], x: np.ndarray) -> tuple[int, float, float]:
    """Moments (count, mean, M2) of a's values and x's (Chan et al.'s pairwise update)."""
    if len(x) == 0:
        return a
    n_a, mean_a, m2_a = a
    n_b, mean_b = len(x), float(x.mean())
    m2_b = float(((x - mean_b) ** 2).sum())
    n = n_a + n_b
    delta = mean_b - mean_a
    return n, mean_a + delta * n_b / n, m2_a + m2_b + delta * delta * n_a * n_b / n


def check_same_format(path: str | os.PathLike, schema: Schema) -> None:
    """ValueError naming the first file of `path` (many files, see worker/datafiles.py) whose format differs from
    the first file's, and how: a CSV header other than the first's; a first data line the format cannot split
    (Criteo: 39 or 40 tab-separated columns; libsvm: label and id:value tokens); labels where the first file has
    none, or none where it has them. Only each file's start is read."""
    files = data_files(path)
    if len(files) < 2:
        return
    first, labeled = files[0], file_has_labels(files[0], schema)
    header = read_csv_header(first, schema.delimiter) if schema.format == "csv" else None
    for name in files:
        if schema.format == "csv":
            other = read_csv_header(name, schema.delimiter)
            if other != header:
                raise ValueError(f"{name}: its CSV header {other} differs from that of {first}, {header}: every "
                                 "file of the data must have the same columns in the same order")  # fmt: skip
        else:
            problem = _first_line_problem(name, schema.format, labeled)
            if problem:
                raise ValueError(f"{name}: {problem}, unlike {first}: every file of the data must be {schema.format}")
        if file_has_labels(name, schema) != labeled:
            has = "has no labels" if labeled else "has labels"
            raise ValueError(f"{name} {has}, unlike {first}: every file of the data must be alike")


def _first_line_problem(name: str, fmt: str, labeled: bool) -> str | None:
    """Why the first non-empty line of a criteo or libsvm file is not of that format, or None."""
    line = _first_line(name, lambda line: bool(line.strip()))
    if line is None:
        return None
    if fmt == "criteo":
        columns = _criteo_body(line).count(b"\t") + 1
        return None if columns in (NUM_COLUMNS - 1, NUM_COLUMNS) else f"its first line has {columns} tab-separated " \
            f"columns, expected {NUM_COLUMNS} (Criteo TSV)"  # fmt: skip
    parsed = _libsvm_line(line, labeled)
    return f"its first line is not libsvm: {parsed}" if isinstance(parsed, str) else None


def read_csv_header(path: str | os.PathLike, delimiter: str) -> list[str] | None:
    """The header's column names of a csv file, or None for an empty file."""
    with _csv_reader(os.fspath(path), delimiter) as reader:
        return next(reader, None)


SAMPLE_SPOTS = 32  # places of a large file read_csv_sample takes records from, past its first half-sample
SPREAD_MIN_BYTES = SAMPLE_SPOTS << 15  # ... when at least this much of the file lies past that half-sample
MAX_SPOT_BYTES = 4 << 20  # read of one spot's span, at most


def read_csv_sample(path: str | os.PathLike, delimiter: str, rows: int) -> tuple[list[str], list[list[str]]]:
    """(header, up to `rows` records that have the header's column count). ValueError for an empty file. The first
    half are the file's first records; the other half follow them, or, in an uncompressed file with at least
    SPREAD_MIN_BYTES more, come from SAMPLE_SPOTS places spread evenly over the rest (each from the line after a
    byte offset), so that a file sorted by time or by label is seen whole. A record cut by a spot's start (a quoted
    field over lines) is dropped with the others of the wrong column count."""
    name = os.fspath(path)
    opened = _csv_reader(name, delimiter)
    with opened as reader:
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{name}: the file is empty; expected a header line")
        sample = _good_records(reader, len(header), rows - rows // 2)
        start = opened.raw.tell()  # past the half-sample (by at most the text layer's read-ahead)
        spread = len(sample) == rows - rows // 2 and not name.endswith(".gz")
        spread = spread and os.path.getsize(name) - start >= SPREAD_MIN_BYTES
        if not spread:
            sample += _good_records(reader, len(header), rows - len(sample))
    if spread:
        sample += _spread_records(name, delimiter, len(header), rows - len(sample), start)
    return header, sample


def _good_records(reader: Any, width: int, limit: int) -> list[list[str]]:
    """Up to `limit` records of the reader with `width` columns (the csv module's errors skipped)."""
    out: list[list[str]] = []
    while len(out) < limit:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error:
            continue
        if len(row) == width:
            out.append(row)
    return out


def _spread_records(name: str, delimiter: str, width: int, want: int, start: int) -> list[list[str]]:
    """Up to `want` records of `width` columns from SAMPLE_SPOTS spans spread evenly over bytes [start, end): each
    span's whole lines (the one its start cuts into, and the one its end cuts, left out), at most want/SAMPLE_SPOTS
    records of it, so no record is read twice."""
    size = os.path.getsize(name)
    out: list[list[str]] = []
    per_spot = -(-want // SAMPLE_SPOTS)
    bounds = [start + (size - start) * k // SAMPLE_SPOTS for k in range(SAMPLE_SPOTS + 1)]
    with open(name, "rb") as f:
        for lo, hi in itertools.pairwise(bounds):
            f.seek(lo)
            span = f.read(min(hi - lo, MAX_SPOT_BYTES))
            first = span.find(b"\n")  # the line the offset fell in is the span before's
            span = span[first + 1 :] if first >= 0 else b""
            if lo + len(span) < size:
                span = span[: span.rfind(b"\n") + 1]  # a line the span's end cuts is the next span's
            text = io.StringIO(span.decode("utf-8", errors="surrogateescape"), newline="")
            out += _good_records(csv.reader(text, delimiter=delimiter), width, min(per_spot, want - len(out)))
            if len(out) >= want:
                break
    return out


def libsvm_field_count(path: str | os.PathLike) -> int:
    """K of a libsvm file: the feature count of its first good line with at least one feature, else 0 (lines
    read without a label when the file has none, as file_has_labels tells)."""
    labeled = _libsvm_labeled(os.fspath(path))
    with open_data(os.fspath(path)) as f:
        for line in f:
            parsed = _libsvm_line(line, labeled)
            if not isinstance(parsed, str) and parsed[1]:
                return len(parsed[1])
    return 0


def file_has_labels(path: str | os.PathLike, schema: Schema) -> bool:
    """Whether the file holds labels, told by its start (see "Files without labels" in the module docstring);
    True for an empty file. Of many files (worker/datafiles.py), the first tells (check_same_format: the others
    agree)."""
    name = data_files(path)[0]
    if schema.format == "csv":
        header = read_csv_header(name, schema.delimiter)
        return not header or schema.label is None or schema.label in header
    if schema.format == "libsvm":
        return _libsvm_labeled(name)
    columns = _first_line(name, lambda line: _criteo_body(line).count(b"\t") + 1 in (NUM_COLUMNS - 1, NUM_COLUMNS))
    return columns is None or _criteo_body(columns).count(b"\t") + 1 == NUM_COLUMNS


LABEL_PROBE_LINES = 1000  # lines file_has_labels reads at most


def _first_line(name: str, fits: Callable[[bytes], bool]) -> bytes | None:
    """The first of the first LABEL_PROBE_LINES lines of a line file that fits, or None."""
    with open_data(name) as f:
        return next((line for line in itertools.islice(f, LABEL_PROBE_LINES) if fits(line)), None)


def _libsvm_labeled(name: str) -> bool:
    """Whether a libsvm file's lines start with a label (see file_has_labels)."""

    def first_token(line: bytes) -> bytes:
        return (line.split() or [b""])[0]

    def fits(line: bytes) -> bool:  # a label (any token without ":") or an id:value
        token = first_token(line)
        return (bool(token) and b":" not in token) or token.partition(b":")[0].isdigit()

    line = _first_line(name, fits)
    return line is None or b":" not in first_token(line)


def _criteo_body(line: bytes) -> bytes:
    """A Criteo line without its line end."""
    return line.rstrip(b"\n").removesuffix(b"\r")


# ---------------------------------------------------------------------------------------------------------
# From cells to batches


@dataclass
class _Cells:
    """A chunk of a worker's share: labels float32 (m,), cells {column: (m,)} and line numbers int64 (m,) of
    its good lines as the format splits them; problems [(line number, problem[, lines])] of the others (lines:
    the physical lines the bad record took, 1 unless given); parsed: the
    columns the format has already read for encode_examples, if any."""

    labels: np.ndarray
    cells: Mapping[str, np.ndarray]
    line_nos: np.ndarray
    problems: list[tuple[int, str]]
    parsed: Parsed | None = None


def _encoded(name: str, schema: Schema, batch_size: int, share: _Share, labeled: bool) -> Iterator[Batch]:
    for chunk in _cell_chunks(name, schema, max(batch_size, _MIN_CHUNK), share, labeled):
        out = encode_examples(schema, chunk.labels, chunk.cells, chunk.parsed)
        out.batch.line_nos = np.delete(chunk.line_nos, out.bad)  # of the good examples, as out.batch holds them
        problems = chunk.problems + [(int(chunk.line_nos[i]), p) for i, p in zip(out.bad.tolist(), out.problems)]
        for line_no, problem, *lines in sorted(problems):  # in file order: the limit is crossed at the right line
            if problem == EMPTY_LINE:
                share.bad.stats.empty_lines += 1
            else:
                share.bad.add(line_no, problem, *lines)
        share.bad.stats.truncated_bags += out.truncated_bags
        if len(out.batch):
            yield out.batch


def _cell_chunks(name: str, schema: Schema, size: int, share: _Share, labeled: bool = True) -> Iterator[_Cells]:
    if schema.format == "criteo":
        return _criteo_cells(name, schema, size, share, labeled)
    if schema.format == "libsvm":
        return _libsvm_cells(name, schema, size, share, labeled)
    return _csv_cells(name, schema, size, share, labeled)


# ---------------------------------------------------------------------------------------------------------
# criteo


def _criteo_cells(name: str, schema: Schema, size: int, share: _Share, labeled: bool = True) -> Iterator[_Cells]:
    """labeled=False: each non-empty line is read as if a label column "0" began it (so a good line has 40
    columns), its label then NaN, and a column count in a bad line's problem told without that column."""
    int_sources, cat_sources, _ = parsed_sources(schema)
    with open_data(name) as f:
        for lines, first in share.chunks(f, size):
            if not labeled:
                lines = [b"0\t" + line if _criteo_body(line).strip(b" ") else line for line in lines]  # not EMPTY_LINE
            scanned = scan_lines(lines, int_sources, cat_sources) if CRITEO_SCAN else None
            if scanned is not None:
                line_nos = first + share.num_workers * np.arange(len(lines), dtype=np.int64)
                labels = scanned.labels if labeled else np.full(len(lines), np.nan, np.float32)
                yield _Cells(labels, scanned.cells, line_nos, [], scanned.parsed)
                continue
            labels, columns, line_nos, problems = parse_share(lines, first, share.num_workers, name)
            cells = {CRITEO_COLUMNS[j]: columns[:, j] for j in range(1, NUM_COLUMNS)}
            if not labeled:
                labels = np.full(len(labels), np.nan, np.float32)
                problems = [(line_no, _without_label(problem)) for line_no, problem in problems]
            yield _Cells(labels, cells, line_nos, problems)


_COLUMN_COUNT = re.compile(rf"(\d+) tab-separated columns, expected {NUM_COLUMNS}")  # criteo.py's wording


def _without_label(problem: str) -> str:
    """A criteo problem of a line read with a label column put before it, told of the line as it is."""
    m = _COLUMN_COUNT.match(problem)
    if m is None:
        return problem
    return (f"{int(m[1]) - 1} tab-separated columns, expected {NUM_COLUMNS - 1} (a file without labels, as its "
            f"first line is){problem[m.end():]}")  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# libsvm

_LIBSVM_LABELS = {b"0": 0.0, b"1": 1.0, b"-1": 0.0, b"+1": 1.0}


def _libsvm_cells(name: str, schema: Schema, size: int, share: _Share, labeled: bool = True) -> Iterator[_Cells]:
    wanted = sorted({int(LIBSVM_COLUMN.fullmatch(c.source)[1]) for c in schema.columns})
    k_fields = wanted[-1] + 1 if wanted else 0
    with open_data(name) as f:
        for lines, first in share.chunks(f, size):
            labels: list[float] = []
            rows: list[list[int]] = []
            line_nos: list[int] = []
            problems: list[tuple[int, str]] = []
            for k, line in enumerate(lines):
                line_no, parsed = first + k * share.num_workers, _libsvm_line(line, labeled)
                if isinstance(parsed, str):
                    problems.append((line_no, parsed))
                elif len(parsed[1]) > k_fields:
                    problems.append((line_no, f"{len(parsed[1])} features, more than the schema's {k_fields} fields "
                                              "(the built-in schema's count is that of the training file's first line "
                                              "with features; --libsvm-fields sets it)"))  # fmt: skip
                else:
                    labels.append(parsed[0])
                    rows.append(parsed[1])
                    line_nos.append(line_no)
            values = _libsvm_values(rows, k_fields)
            cells = {f"f{k}": hex_strings(values[:, k]) for k in wanted}
            yield _Cells(np.array(labels, dtype=np.float32), cells, np.array(line_nos, dtype=np.int64), problems)


def _libsvm_line(line: bytes, labeled: bool = True) -> tuple[float, list[int]] | str:
    """(label, the raw value of each feature token, MISSING_CAT for a value of 0), or what is wrong; labeled=False:
    every token is a feature, the label NaN."""
    tokens = line.split()
    if not tokens:
        return EMPTY_LINE
    label = _LIBSVM_LABELS.get(tokens[0]) if labeled else math.nan
    if label is None:
        try:
            v = float(tokens[0])
        except ValueError:
            v = math.nan
        if v not in (0.0, 1.0, -1.0):
            return f"label {_text(tokens[0])!r}, expected 0, 1, -1 or +1"
        label = float(v == 1.0)
    values = []
    for tok in tokens[1:] if labeled else tokens:
        key, sep, value = tok.partition(b":")
        if not sep or not key.isdigit():
            return f"feature {_text(tok)!r}, expected id:value with a non-negative integer id"
        ident = int(key)
        if ident >= _MISSING:
            return f"feature {_text(tok)!r}: id too large, expected < 2**64 - 1"
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        if not math.isfinite(v):
            return f"feature {_text(tok)!r}: value {_text(value)!r}, expected a finite number"
        values.append(ident if v != 0 else _MISSING)
    return label, values


def _libsvm_values(rows: list[list[int]], k_fields: int) -> np.ndarray:
    """uint64 (n, K): the rows' values, MISSING_CAT past a row's last feature."""
    n = len(rows)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.intp, count=n)
    values = np.full((n, k_fields), MISSING_CAT, dtype=np.uint64)
    present = np.arange(k_fields)[None, :] < lengths[:, None]
    values[present] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.uint64, count=int(lengths.sum()))
    return values


# ---------------------------------------------------------------------------------------------------------
# csv


MAX_CSV_FIELD = 1 << 30  # the csv module's default limit (128 KiB) would turn a long bag cell into a bad line
CHUNK_CHARS = 1 << 22  # rows x longest cell of a CSV chunk at most (one row alone may pass it): numpy's string
# arrays pad every cell to the longest, 4 bytes a character, so one 100 KB cell among 4,096 rows took 1.6 GB a column
MAX_RECORD_LINES = 100  # physical lines of one CSV record at most: more is a quote left open (a bad record)


class _csv_reader:
    """A context manager giving a csv.reader over a file (gzip read through), UTF-8 with a BOM ignored."""

    def __init__(self, name: str, delimiter: str):
        self.raw = open_data(name)
        text = io.TextIOWrapper(self.raw, encoding="utf-8-sig", errors="surrogateescape", newline="")
        csv.field_size_limit(MAX_CSV_FIELD)  # long bag cells are read (then cut to max_length), not bad lines
        self.reader = csv.reader(text, delimiter=delimiter)

    def __enter__(self):
        return self.reader

    def __exit__(self, *exc: object) -> None:
        self.raw.close()


def _csv_columns(name: str, header: list[str], schema: Schema, labeled: bool = True
                 ) -> tuple[int | None, dict[str, int]]:  # fmt: skip
    """(label index, {source: index}) of a header, or ValueError naming what the schema needs that it lacks;
    labeled=False: no label is read (index None)."""
    if not header:
        raise ValueError(f"{name}: the header line names no columns")
    label = schema.label if schema.label is not None else (header[0] if header else None)
    sources = list(dict.fromkeys(c.source for c in schema.columns))
    if not labeled:
        label = None
    named = [label, *sources] if labeled else sources
    unknown = [c for c in named if c not in header]
    if unknown:
        raise ValueError(f"{name}: columns {unknown} are not in the header; its columns are {header}")
    repeated = [c for c in named if header.count(c) > 1]
    if repeated:
        raise ValueError(f"{name}: columns {repeated} appear more than once in the header {header}")
    if label in sources:
        raise ValueError(f"{name}: column {label!r} is the label (the first column) and a column of the schema")
    return (header.index(label) if labeled else None), {s: header.index(s) for s in sources}


def _csv_cells(name: str, schema: Schema, size: int, share: _Share, labeled: bool = True) -> Iterator[_Cells]:
    """Chunks of `size` records of the share: through csv_fast's scan when CSV_SCAN allows it and all of the
    chunk's lines are plain and UTF-8, else through the csv module (the lines of the run taken before the first
    that is not, each read from its text; then records from there on)."""
    with open_data(name) as raw:
        lines = CsvLines(raw)
        csv.field_size_limit(MAX_CSV_FIELD)  # long bag cells are read (then cut to max_length), not bad lines
        reader = csv.reader(lines.texts(), delimiter=schema.delimiter)
        header = next(reader, None)
        if header is None:
            return
        label_at, sources = _csv_columns(name, header, schema, labeled)
        parsed = parsed_sources(schema)
        scan = CSV_SCAN and ord(schema.delimiter) < 128
        n, index = share.num_workers, 0  # index: the records read so far
        while True:
            chunk = _CsvRecords(share.bad.stats, len(header), label_at)
            if scan:
                base = lines.consumed
                plain = lines.take_plain(share.worker_id, n, index, size)
                index += plain.lines
                line_nos = base + 1 + plain.first + n * np.arange(plain.count, dtype=np.int64)
                if not plain.stopped and _utf8(plain):
                    share.bad.stats.lines_read += plain.count
                    if plain.count:
                        scanned = scan_plain(plain, schema.delimiter, len(header), label_at, sources, parsed)
                        yield from _scanned_chunks(scanned, line_nos, len(header), label_at)
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
                yield from _csv_chunks(chunk.labels, chunk.rows, chunk.line_nos, chunk.problems, sources)
            if ended:
                return


def _utf8(plain: Plain) -> bool:
    """Whether a run's lines are UTF-8 (the scan's cells hash as their text only then)."""
    if plain.ascii:
        return True
    try:
        plain.buf.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class _CsvRecords:
    """A chunk's records as the csv module reads them: the good ones' labels, rows and first lines; problems."""

    def __init__(self, stats: ReadStats, width: int, label_at: int | None):
        self.stats, self.width, self.label_at = stats, width, label_at
        self.labels: list[float] = []
        self.rows: list[list[str]] = []
        self.line_nos: list[int] = []
        self.problems: list[tuple] = []
        self.lines = 0  # records of the chunk, bad ones included

    def add(self, row: list[str] | csv.Error, start: int, end: int) -> None:
        """A record of physical lines start..end."""
        self.stats.lines_read += 1
        self.lines += 1
        problem = _csv_problem(row, self.width, self.label_at)
        if problem is None and end - start >= MAX_RECORD_LINES:
            problem = f"a record of {end - start + 1:,} lines, more than {MAX_RECORD_LINES}"
        if problem is not None and end > start:  # a bad record over several lines: each of them is lost
            self.stats.lines_read += end - start
            spans = f" (a record from line {start} to line {end}: a quoted field spans them; a stray quote?)"
            self.problems.append((start, problem + spans, end - start + 1))
        elif problem is not None:
            self.problems.append((start, problem))
        else:
            self.labels.append(math.nan if self.label_at is None else float(row[self.label_at]))
            self.rows.append(row)
            self.line_nos.append(start)


def _scanned_chunks(scanned: Scanned, line_nos: np.ndarray, width: int, label_at: int | None) -> Iterator[_Cells]:
    """The chunk of a scanned run (the rules of _csv_problem), cut as _csv_chunks cuts."""
    columns, problems = scanned.columns, []
    bad = columns != width
    for i in np.flatnonzero(bad | (columns == 1)).tolist():
        if columns[i] == 0 or (columns[i] == 1 and not scanned.line(i).strip()):
            problems.append((int(line_nos[i]), EMPTY_LINE))
            bad[i] = True
        elif bad[i]:
            problems.append((int(line_nos[i]), f"{columns[i]} columns, expected {width} as in the header"))
    if label_at is not None:
        bad_label = ~bad & (scanned.labels != 0) & (scanned.labels != 1)
        problems += [(int(line_nos[i]), _label_problem(scanned.label(i))) for i in np.flatnonzero(bad_label)]
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
        yield _Cells(labels[a:b], piece, line_nos[a:b], mine, part)


def _csv_chunks(
    labels: list[float], rows: list[list[str]], line_nos: list[int], problems: list, sources: dict
) -> Iterator[_Cells]:
    """The chunk of these records, cut where rows x the longest cell read would pass CHUNK_CHARS (each piece
    with the problems of the lines before the next piece)."""
    columns = {s: [r[i] for r in rows] for s, i in sources.items()}
    if not rows or max((max(map(len, c)) for c in columns.values()), default=0) * len(rows) <= CHUNK_CHARS:
        yield _csv_chunk(labels, columns, line_nos, problems)
        return
    bounds = _cut_bounds([max(w) for w in zip(*(map(len, c) for c in columns.values()))])
    for a, b in itertools.pairwise(bounds):
        mine = _piece_problems(problems, line_nos, a, b)
        yield _csv_chunk(labels[a:b], {s: c[a:b] for s, c in columns.items()}, line_nos[a:b], mine)


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


def _csv_chunk(labels: list[float], columns: dict[str, list[str]], line_nos: list[int], problems: list) -> _Cells:
    cells = {s: np.array(c, dtype=np.str_) for s, c in columns.items()}
    return _Cells(np.array(labels, dtype=np.float32), cells, np.array(line_nos, dtype=np.int64), problems)


def _csv_problem(row: list[str] | csv.Error, width: int, label_at: int | None) -> str | None:
    """What is wrong with a record (label_at None: it has no label), or None."""
    if isinstance(row, csv.Error):
        return f"unreadable CSV: {row}"
    if not row or (len(row) == 1 and not row[0].strip()):
        return EMPTY_LINE
    if len(row) != width:
        return f"{len(row)} columns, expected {width} as in the header"
    if label_at is None or _number(row[label_at]) in (0.0, 1.0):
        return None
    return _label_problem(row[label_at])


def _label_problem(label: str) -> str:
    return (
        f"label {label!r}, expected 0 or 1 (the label is the header's first column unless --label-column or "
        "the schema's `label` names another)"
    )


def _number(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return math.nan


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------------------
# Shared machinery: opening, shares, bad-line accounting.


def open_data(name: str) -> BinaryIO:
    """A data file opened for binary reading, through gzip if its name ends in .gz."""
    return _GzipData(name, "rb") if name.endswith(".gz") else open(name, "rb")


class _GzipData(gzip.GzipFile):
    """A .gz file whose read errors (not gzip, damaged, cut short) are ValueErrors that name it: gzip's own
    name neither the file nor gzip. Iteration and io.TextIOWrapper read through these methods."""

    def read(self, size: int = -1) -> bytes:
        return self._named(super().read, size)

    def read1(self, size: int = -1) -> bytes:
        return self._named(super().read1, size)

    def peek(self, n: int = 0) -> bytes:
        return self._named(super().peek, n)

    def readline(self, size: int = -1) -> bytes:
        return self._named(super().readline, size)

    def _named(self, method, arg: int) -> bytes:
        try:
            return method(arg)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError(f"{self.name}: its name ends in .gz, but it does not read as gzip: {e}") from None


class _BadLines:
    def __init__(self, name: str, limit: int, stats: ReadStats):
        self.name, self.limit, self.stats = name, limit, stats

    def add(self, line_no: int, problem: str, lines: int = 1) -> None:
        """Counts a bad record of `lines` physical lines from line_no; ValueError past the limit."""
        s = self.stats
        s.bad_lines += lines
        message = f"{self.name} line {line_no}: {problem}"
        if s.first_bad is None:
            s.first_bad = message
        if s.bad_lines > self.limit:
            lines = f"{s.bad_lines:,} bad line{'s' if s.bad_lines != 1 else ''}"
            raise ValueError(f"{message}; {lines}, more than --max-bad-lines {self.limit}")


@dataclass
class _Share:
    worker_id: int
    num_workers: int
    bad: _BadLines

    def chunks(self, lines: Iterable[bytes], size: int) -> Iterator[tuple[list[bytes], int]]:
        """This worker's lines of a headerless line file, in chunks of up to `size`, each with the 1-based
        line number of its first line (the k-th line of a chunk is at first + k * num_workers)."""
        mine = itertools.islice(lines, self.worker_id, None, self.num_workers)
        first = self.worker_id + 1
        while chunk := list(itertools.islice(mine, size)):
            self.bad.stats.lines_read += len(chunk)
            yield chunk, first
            first += len(chunk) * self.num_workers
