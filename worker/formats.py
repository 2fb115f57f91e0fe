"""Training data in three formats, read through a schema into Batches: Criteo TSV, CSV with a header, libsvm.

    read_batches(path, schema, batch_size, *, worker_id=0, num_workers=1, max_bad_lines=0, max_bad_share=None,
                 stats=None, labeled=True, blank_labels=False) -> Iterator[Batch]
    file_has_labels(path, schema) -> bool       # whether a file to score holds labels (see "Files without labels")
    column_stats(path, schema) -> {column name: (mean, std)}   # of the schema's standardize columns
    check_same_format(path, schema)             # ValueError naming the first file unlike the first one
    detect_format(path) -> (format, delimiter, what was seen)   # --format auto: told by the data's first line
    idle_workers(file_residues, num_workers) -> [worker id, ...]   # those whose share of such files holds no line
    first_with_content(path) -> str             # the first file that is not empty (its first, if all are)
    csv_records(path, delimiter, rows) -> (header, records)   # a sample of the first file holding records
    read_csv_header(path, delimiter), read_csv_sample(path, delimiter, rows), libsvm_field_count(path)

A format (schema.format) splits each data line into a label and named cells; worker/encode.py turns the cells
into the Batch's ids and numeric features as the schema says. Each format's reader, in worker/readers/, states
the format at its top: the columns a schema's sources name, its bad lines, its files without labels and how
file_has_labels tells them apart:
  criteo  label TAB I1..I13 TAB C1..C26      worker/readers/criteo_reader.py
  csv     a header line, then records        worker/readers/csv_reader.py (read_csv_sample: csv_sample.py;
                                             the delimiter --format auto tells: csv_dialect.py)
  libsvm  label id:value id:value ...        worker/readers/libsvm_reader.py (libsvm_field_count)
What they share (ReadStats, a worker's share of a file, bad-line accounting, plain or gzip files) is
worker/readers/share.py's. This module reads their chunks into Batches, file after file.

Common to all formats:
  - A path ending in ".gz" is read through gzip; gzip data under another name, other compressions, binary table
    formats (Parquet, ORC, Avro, Arrow) and UTF-16 text are refused by name (share.open_data). Text is UTF-8; a
    BOM that starts a file is left out.
  - Data lines are numbered from 0, the CSV header excluded (for CSV a "line" is a record, which may span
    several physical lines inside quotes; a bad record that does counts each of its lines as a bad line, so that
    a stray quote, which runs a record to the end of the file, cannot lose the rest of it as one bad line).
    Worker i of n reads the data lines whose number % n == i, so n workers together read every line exactly once.
  - `path` may name many files (worker/datafiles.py: a directory, a glob, a comma-separated list), read in order
    as one stream: batches run on across files, and bad lines count against max_bad_lines over the stream, each
    named by its own file and line. Worker i reads, of the k-th file (from 0), the lines whose number % n ==
    (i + k) % n: still every line exactly once, and small files spread over the workers rather than all to worker
    0. check_same_format refuses files that differ in format from the first. A file of no content (no bytes, or
    whitespace only: Spark's gzip'ed part file of an empty partition) among others holds no examples: the first
    file, wherever one file speaks for all (the header, labels or not), is the first one with content.
  - An empty data line (nothing but whitespace; in a CSV, blank cells only: the rows spreadsheet exports often
    end with) is skipped and counted
    in stats.empty_lines, not as a bad line (of them, libsvm lines of a comment or query id only in
    stats.comment_lines, CSV records of blank cells in stats.blank_cell_rows; CSV headers read in stats.headers).
  - A malformed data line is skipped and counted in `stats` (ReadStats): one the
    format cannot split (the problems its reader lists), or one with a cell the schema cannot read (encode.py: a
    numeric cell that is not a number, an integer column that is not an int64 integer, a bag token that is
    not id:weight, a raw id that is not a decimal). A worker counts only the bad lines of its share; when its
    count exceeds max_bad_lines the reader raises ValueError
    "<file> line <L>: <problem>; <k> bad lines, more than --max-bad-lines <max>", naming the first bad line of
    the stream (stats.first_bad: L its 1-based physical line), where the trouble starts, not the one that crossed
    the limit; so it does, given max_bad_share, once the bad records (a CSV record over several lines counts
    once) exceed readers.share.BAD_SHARE_AFTER and max_bad_share of the lines read ("<k> bad records of the
    first <n> lines read, more than 1 in <1/share>: is the data in this format, with labels of 0 and 1?", the
    labels left out under blank_labels or labeled=False, which read none; lines are counted a chunk at a time,
    so <n> may run up to a chunk past the bad line that crossed it). Bad lines are counted in file order.
  - Batches hold batch_size good examples each (the last may hold fewer), in file order; probs is None;
    line_nos holds each example's 1-based physical line (a CSV record's first line; the header is line 1).
    Bags cut to their column's max_length are counted in stats.truncated_bags.

Files without labels (read_batches labeled=False; only `ps-worker predict` reads them, training and eval
always read with labels, and refuse such a file's lines as bad): every example's label is NaN, and each line
is as its reader's docstring says. file_has_labels tells them apart by the file's start (at most the first
LABEL_PROBE_LINES lines, worker/readers/share.py), as the reader of the file's format says.

Blank labels (read_batches blank_labels=True; `ps-worker predict` only, which reads no label): in a file with
labels, a line whose label cell is empty (csv: or holds a missing value's text, cells.MISSING_TEXTS: NA, ?) is
an example without a label, NaN, not a bad line: a file of rows to score keeps its label column with the cells
left blank. So is a line whose label cell holds anything else but a label (2, x: csv, criteo; libsvm: a first
token without ":"), its features read as any line's; such good lines are counted in stats.unread_labels (the first
in stats.first_unread_label). A CSV record equal to the header stays a bad line. libsvm has no empty label cell.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from collections.abc import Collection, Iterator, Mapping, Sequence

import numpy as np

from worker.batch import Batch, rebatch
from worker.cells import float_values
from worker.criteo import (
    BLANK_CELLS,
    COMMENT_LINE,
    EMPTY_PROBLEMS,
    NUM_COLUMNS,
    libsvm_like,
    libsvm_tokens,
    other_format_hint,
)
from worker.datafiles import data_files
from worker.encode import encode_examples
from worker.readers import criteo_reader, csv_reader, libsvm_reader
from worker.readers.csv_dialect import csv_delimiter
from worker.readers.csv_header import DELIMITERS, delimiter_name
from worker.readers.csv_records import read_csv_header, read_header_cells
from worker.readers.csv_sample import read_csv_sample
from worker.readers.libsvm_reader import libsvm_field_count
from worker.readers.share import (
    LABEL_PROBE_LINES,
    BadLines,
    Cells,
    ReadStats,
    Share,
    first_line,
    has_control_bytes,
    is_blank,
)
from worker.schema import Schema
from worker.schema_hints import header_reads_like_an_example

__all__ = [  # the public API; ReadStats and the last three live in worker/readers/, importable from here
    "check_same_format",
    "column_stats",
    "csv_records",
    "detect_format",
    "file_has_labels",
    "first_with_content",
    "read_batches",
    "ReadStats",
    "libsvm_field_count",
    "read_csv_header",
    "read_csv_sample",
]

_MIN_CHUNK = 4096  # lines split and encoded at a time, at least (per-column costs are paid once a chunk)


def read_batches(
    path: str | os.PathLike,
    schema: Schema,
    batch_size: int,
    *,
    worker_id: int = 0,
    num_workers: int = 1,
    max_bad_lines: int = 0,
    max_bad_share: float | None = None,
    stats: ReadStats | None = None,
    labeled: bool = True,
    blank_labels: bool = False,
) -> Iterator[Batch]:
    """Batches of this worker's share of the file (see the module docstring; labeled=False: a file without
    labels; blank_labels: a blank label cell is no label, NaN). Arguments are checked here; the file (and a CSV
    header against the schema) when iteration starts."""
    if batch_size < 1:
        raise ValueError(f"batch_size is {batch_size}, expected >= 1")
    if num_workers < 1 or not 0 <= worker_id < num_workers:
        raise ValueError(f"worker_id {worker_id} of num_workers {num_workers}: expected 0 <= worker_id < num_workers")
    if max_bad_lines < 0:
        raise ValueError(f"max_bad_lines is {max_bad_lines}, expected >= 0")
    if max_bad_share is not None and not 0 < max_bad_share <= 1:
        raise ValueError(f"max_bad_share is {max_bad_share}, expected a share in (0, 1]")
    if schema.needs_stats():
        raise ValueError("the schema has standardize columns without mean and std: column_stats and with_stats")
    files = data_files(path)
    stats = stats if stats is not None else ReadStats()

    def stream() -> Iterator[Batch]:
        for k, name in enumerate(files):  # file k's share: its lines whose number % n == (worker_id + k) % n
            share = Share(
                (worker_id + k) % num_workers,
                num_workers,
                BadLines(name, max_bad_lines, stats, max_bad_share, labels=labeled and not blank_labels),
            )
            yield from _encoded(name, schema, batch_size, share, labeled, blank_labels)

    return rebatch(stream(), batch_size)


def idle_workers(file_residues: Sequence[Collection[int]], num_workers: int) -> list[int]:
    """The workers of num_workers whose shares (read_batches) of files, in reading order, hold no line of data:
    file_residues, of each file, the residues mod num_workers of its data lines' 0-based indices among its lines
    (linecount.LineCount.per_file_residues; a CSV's, of records: csv_records.csv_data_places); worker i reads
    line j of the k-th file when j % num_workers == (i + k) % num_workers."""
    reads = np.zeros(num_workers, dtype=bool)
    for k, residues in enumerate(file_residues):
        reads[(np.fromiter(residues, dtype=np.int64, count=len(residues)) - k) % num_workers] = True
    return np.flatnonzero(~reads).tolist()


def column_stats(path: str | os.PathLike, schema: Schema) -> dict[str, tuple[float, float]]:
    """{name: (mean, std)} of every standardize column: of its present raw values over the good lines of the
    whole file (std of the population), in one pass; a column of one value v (a constant column) gives (v, 1),
    one with no value (0, 1): the values a schema may hold (std > 0)."""
    columns = [c for c in schema.dense_columns() if c.transform == "standardize"]
    if not columns:
        return {}
    placeholder = schema.with_stats({c.name: (0.0, 1.0) for c in columns})  # to find the bad lines
    moments = {c.name: (0, 0.0, 0.0, math.inf, -math.inf) for c in columns}  # count, mean, M2, lowest, highest
    for chunk in itertools.chain.from_iterable(
        _cell_chunks(name, placeholder, _MIN_CHUNK, Share(0, 1, BadLines(name, sys.maxsize, ReadStats())))
        for name in data_files(path)
    ):
        good = np.ones(len(chunk.labels), dtype=bool)
        good[encode_examples(placeholder, chunk.labels, chunk.cells, chunk.parsed).bad] = False
        for c in columns:
            x, missing, _ = float_values(chunk.cells[c.source])
            moments[c.name] = _merge(moments[c.name], x[good & ~missing])
    return {k: (0.0, 1.0) if not n else (lo, 1.0) if lo == hi else (mean, math.sqrt(m2 / n))
            for k, (n, mean, m2, lo, hi) in moments.items()}  # fmt: skip


def _merge(a: tuple[int, float, float, float, float], x: np.ndarray) -> tuple[int, float, float, float, float]:
    """Moments (count, mean, M2, lowest, highest) of a's values and x's (Chan et al.'s pairwise update)."""
    if len(x) == 0:
        return a
    n_a, mean_a, m2_a, lo, hi = a
    n_b, mean_b = len(x), float(x.mean())
    m2_b = float(((x - mean_b) ** 2).sum())
    n = n_a + n_b
    delta = mean_b - mean_a
    return (n, mean_a + delta * n_b / n, m2_a + m2_b + delta * delta * n_a * n_b / n, min(lo, float(x.min())),
            max(hi, float(x.max())))  # fmt: skip


def check_same_format(path: str | os.PathLike, schema: Schema) -> None:
    """ValueError naming the first file of `path` (many files, see worker/datafiles.py) whose format differs from
    the first file's with content, and how: a CSV header other than the first's; a first data line the format
    cannot split (Criteo: 39 or 40 tab-separated columns; libsvm: label and id:value tokens); labels where the
    first file has none, or none where it has them. Files of no content (share.is_blank) are left out; ValueError
    if every file is such. Read as criteo, the first file with content (a single file: that file) whose line 1 has
    no tab and looks like another format (CSV, another delimiter, libsvm: criteo.other_format_hint) is refused too,
    with that format's flag: every line would be malformed, so it is said at once, not after --max-bad-lines of
    them. Where --format auto told the schema's format (schema.format_from: the training data's), a first file with
    content that detect_format tells as another format, or as CSV of another delimiter, is refused naming both
    (--eval-data of Criteo TSV for a CSV run, say). Only each file's start is read."""
    listed = data_files(path)
    name = first_with_content(path) if listed else None
    if name is not None and schema.format_from:  # --format auto told the training data's: another format, said so
        try:
            fmt, delimiter, seen = detect_format(name)
        except ValueError:  # nothing told: the checks of schema.format below say what is wrong, as the reader would
            fmt, delimiter = schema.format, schema.delimiter
        if fmt != schema.format or (fmt == "csv" and delimiter != schema.delimiter):
            raise ValueError(f"{name} reads as {fmt} ({seen}), but the training data as {schema.format} "
                             f"({schema.format_from}): every file a run reads must be in the training data's "
                             "format; nothing was read")  # fmt: skip
    if name is not None and schema.format == "criteo":
        other = criteo_reader.other_format_first_line(name)
        if other:  # every line would be malformed: said at once, not after --max-bad-lines of them
            raise ValueError(f"{name} line 1: {other}; a file of no tab is no Criteo TSV: nothing was read")
    if len(listed) < 2:
        return
    files = [name for name in listed if not is_blank(name)]
    if not files:
        raise ValueError(f"{os.fspath(path)}: its {len(listed)} files are all empty: no examples to read")
    first, labeled = files[0], file_has_labels(files[0], schema)
    header = read_csv_header(first, schema.delimiter) if schema.format == "csv" else None
    for name in files:
        if schema.format == "csv":
            other = read_csv_header(name, schema.delimiter)
            if other != header:
                raise ValueError(f"{name}: its CSV header {other} differs from that of {first}, {header}: every "
                                 "file of the data must have the same columns in the same order")  # fmt: skip
        else:
            problem = (
                criteo_reader.first_line_problem(name)
                if schema.format == "criteo"
                else libsvm_reader.first_line_problem(name, labeled)
            )
            if problem and name == first:
                raise ValueError(f"{name}: {problem}: the data must be {schema.format} (is --format right?)")
            if problem:
                raise ValueError(f"{name}: {problem}, unlike {first}: every file of the data must be {schema.format}")
        if file_has_labels(name, schema) != labeled:
            has = "has no labels" if labeled else "has labels"
            raise ValueError(f"{name} {has}, unlike {first}: every file of the data must be alike")


def detect_format(path: str | os.PathLike) -> tuple[str, str | None, str]:
    """(format, delimiter, what was seen) of `--format auto`, told by the first file with content of path
    (first_with_content); the delimiter is a CSV's, None for the other formats:
      libsvm  its first line with content, past lines of a comment only (# ...), is a label and id:value tokens
              (criteo.libsvm_like: SVMlight's qid and comments as the reader reads them)
      criteo  that line is 40 tab-separated columns, 0 or 1 first, or blank with integers or blank cells after it
              (a file to score; or 39, a file without labels: the first an integer or empty): Criteo TSV, which has
              no header line
      csv     its first line is a header: two or more names (read by the csv module, quotes and all) separated by
              commas, tabs, ';' or '|' (the one the records under it agree with: readers/csv_dialect.py), not an
              example (schema_hints.header_reads_like_an_example: a label, 0 or 1, first, mostly numbers, or
              numbers only)
    ValueError for a file of no content; naming --format and what was seen, for anything else: a first line that
    reads like an example (a CSV without a header line; tab-separated: not Criteo's 40 columns, or Criteo's of
    another label), a delimiter the records refuse or do not tell, blank lines above a header, a line of one
    column, a line of control bytes (a binary file). Only the file's start is read (LABEL_PROBE_LINES lines at
    most, and the first csv_dialect.CHECKED_RECORDS records)."""
    name = first_with_content(path)
    line = first_line(name, lambda line: bool(line.strip()))
    cannot = f"{name}: --format auto cannot tell its format"
    if line is None and is_blank(name):
        raise ValueError(f"{name}: no examples in it (it is empty): no line to tell its format by")
    if line is None:
        raise ValueError(f"{cannot}: its first {LABEL_PROBE_LINES:,} lines are blank; give --format (criteo, csv, "
                         "libsvm)")  # fmt: skip
    body = line.rstrip(b"\r\n")
    shown = repr(body.decode("utf-8", "replace")[:100])
    if has_control_bytes(body):
        raise ValueError(f"{cannot}: its first line ({shown}) holds control bytes, which text does not: a binary "
                         "file, or a damaged one? Data files are text: Criteo TSV, CSV with a header line, libsvm")  # fmt: skip
    cells = body.split(b"\t")
    first = cells[0].strip()
    past_comments = first_line(name, lambda line: bool(libsvm_tokens(line))) or b""  # (lines of a comment: # ...)
    if libsvm_like(past_comments.rstrip(b"\r\n")):  # (whitespace-separated: tabs too, as the reader splits it)
        first = "its first line" if past_comments == line else "its first data line, below comment lines (# ...),"
        return "libsvm", None, f"{first} is a label and id:value tokens"
    criteo_ints = len(cells) == NUM_COLUMNS and all(not c or c.lstrip(b"-").isdigit() for c in cells[1:14])
    seen = _criteo_seen(cells, criteo_ints)
    if seen:
        return "criteo", None, seen
    if not criteo_ints and not read_header_cells(name, ",") and any(d.encode() in body for d in DELIMITERS):
        raise ValueError(f"{cannot}: its first line is blank, and the first with content ({shown}) is further down: "
                         "a CSV file's header is its first line; remove the blank lines above it")  # fmt: skip
    try:
        found = None if criteo_ints else csv_delimiter(name)  # (a Criteo line of another label: said below)
    except ValueError as e:
        raise ValueError(f"{cannot}: its first line ({shown}) {e}; give --format (criteo, csv, libsvm), or "
                         "--schema naming the delimiter (`ps-worker schema --data FILE --delimiter ...` writes "
                         "one)") from None  # fmt: skip
    if found is not None:
        delimiter, header = found
        example = header_reads_like_an_example(path, header, delimiter=delimiter)
        if not example:
            return "csv", delimiter, f"a header line of {len(header)} {delimiter_name(delimiter)}-separated names"
        if delimiter != "\t":  # (tab-separated numbers: said as columns that are not Criteo's, below)
            raise ValueError(f"{cannot}: {example.removeprefix(f'{name}: ')}")
    if len(cells) in (NUM_COLUMNS - 1, NUM_COLUMNS):
        what = f"{len(cells)} tab-separated columns, {first.decode('utf-8', 'replace')!r} first, not a label (0 or 1)"
    else:
        what = f"{len(cells)} tab-separated columns, not Criteo's {NUM_COLUMNS}" if len(cells) > 1 else "one column"
    raise ValueError(f"{cannot}: its first line ({shown}) is {what}{other_format_hint(body)}; it tells libsvm, "
                     "Criteo TSV and CSV with a header line of names (separated by commas, tabs, ';' or '|'): give "
                     "--format (criteo, csv, libsvm), or --schema for another layout (`ps-worker schema --data FILE "
                     "--delimiter ...` writes one)")  # fmt: skip


def _criteo_seen(cells: list[bytes], criteo_ints: bool) -> str:
    """What detect_format sees in a first line of Criteo TSV (cells: split at tabs; criteo_ints: 40 of them, those of
    I1..I13 integers or blank), else ""."""
    first = cells[0].strip()
    if len(cells) == NUM_COLUMNS and first in (b"0", b"1"):
        return f"its first line is {NUM_COLUMNS} tab-separated columns, a label (0 or 1) first, no header"
    if len(cells) == NUM_COLUMNS - 1 and (not first or first.lstrip(b"-").isdigit()):
        return f"its first line is {NUM_COLUMNS - 1} tab-separated columns, Criteo TSV without labels"
    if criteo_ints and not first:
        return (f"its first line is {NUM_COLUMNS} tab-separated columns, a blank label first (a file to score), "
                "integers next")  # fmt: skip
    return ""


def file_has_labels(path: str | os.PathLike, schema: Schema) -> bool:
    """Whether the file holds labels, told by its start (see "Files without labels" in the module docstring);
    True for an empty file. Of many files (worker/datafiles.py), the first with content tells (check_same_format:
    the others agree)."""
    name = first_with_content(path)
    if schema.format == "csv":
        return csv_reader.has_labels(name, schema)
    if schema.format == "libsvm":
        return libsvm_reader.has_labels(name)
    return criteo_reader.has_labels(name)


def csv_records(path: str | os.PathLike, delimiter: str, rows: int) -> tuple[list[str], list[list[str]]]:
    """read_csv_sample's (header, up to `rows` records) of the csv data of path (worker/datafiles.py): its first file
    with content, or, where that one holds only its header (a part file of an empty partition), the first later file
    of that header that holds a record. A file of another header ends the search (check_same_format refuses it)."""
    first = first_with_content(path)
    header, records = read_csv_sample(first, delimiter, rows)
    files = data_files(path)
    for name in files[files.index(first) + 1 :]:
        if records:
            break
        if is_blank(name):
            continue
        h, more = read_csv_sample(name, delimiter, rows)
        if h != header:
            break
        records = more
    return header, records


def first_with_content(path: str | os.PathLike) -> str:
    """The first file of path (worker/datafiles.py) that holds more than whitespace (share.is_blank); the first
    file if none does."""
    files = data_files(path)
    if len(files) == 1:
        return files[0]
    return next((name for name in files if not is_blank(name)), files[0])


def _encoded(name: str, schema: Schema, batch_size: int, share: Share, labeled: bool, blank_labels: bool = False
             ) -> Iterator[Batch]:  # fmt: skip
    for chunk in _cell_chunks(name, schema, max(batch_size, _MIN_CHUNK), share, labeled, blank_labels):
        out = encode_examples(schema, chunk.labels, chunk.cells, chunk.parsed)
        out.batch.line_nos = np.delete(chunk.line_nos, out.bad)  # of the good examples, as out.batch holds them
        problems = chunk.problems + [(int(chunk.line_nos[i]), p) for i, p in zip(out.bad.tolist(), out.problems)]
        for line_no, problem, *lines in sorted(problems):  # in file order: first_bad is the first in the file
            if problem in EMPTY_PROBLEMS:
                share.bad.stats.empty_lines += 1
                share.bad.stats.comment_lines += problem == COMMENT_LINE
                share.bad.stats.blank_cell_rows += problem == BLANK_CELLS
            else:
                share.bad.add(line_no, problem, *lines)
        share.bad.stats.truncated_bags += out.truncated_bags
        if chunk.unread_labels:
            _count_unread_labels(share.bad.stats, name, chunk.unread_labels, out.batch.line_nos)
        if chunk.left_value is not None and share.bad.stats.first_left_value is None:
            share.bad.stats.first_left_value = f"{name} line {chunk.left_value[0]}: value {chunk.left_value[1]!r}"
        if len(out.batch):
            yield out.batch


def _count_unread_labels(stats: ReadStats, name: str, unread: Mapping[int, str], good: np.ndarray) -> None:
    """Counts into stats the unread labels (Cells.unread_labels) of the good lines (their line numbers)."""
    lines = [n for n in good.tolist() if n in unread]
    if lines and stats.first_unread_label is None:
        stats.first_unread_label = f"{name} line {lines[0]}: label {unread[lines[0]]!r}"
    stats.unread_labels += len(lines)


def _cell_chunks(name: str, schema: Schema, size: int, share: Share, labeled: bool = True,
                 blank_labels: bool = False) -> Iterator[Cells]:  # fmt: skip
    """The chunks of cells of the share of a file, as its format's reader splits them."""
    if schema.format == "criteo":
        return criteo_reader.criteo_cells(name, schema, size, share, labeled, blank_labels)
    if schema.format == "libsvm":
        return libsvm_reader.libsvm_cells(name, schema, size, share, labeled, blank_labels)
    return csv_reader.csv_cells(name, schema, size, share, labeled, blank_labels)
