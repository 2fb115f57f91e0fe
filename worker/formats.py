"""Training data in three formats, read through a schema into Batches: Criteo TSV, CSV with a header, libsvm.

    read_batches(path, schema, batch_size, *, worker_id=0, num_workers=1, max_bad_lines=0, max_bad_share=None,
                 stats=None, labeled=True, blank_labels=False) -> Iterator[Batch]
    file_has_labels(path, schema) -> bool       # whether a file to score holds labels (see "Files without labels")
    column_stats(path, schema) -> {column name: (mean, std)}   # of the schema's standardize columns
    idle_workers(file_residues, num_workers) -> [worker id, ...]   # those whose share of such files holds no line
    file_residue(worker_id, k, num_workers) -> int  # worker_id reads file k's lines j with j % num_workers == it
    first_with_content(path) -> str             # the first file that is not empty (its first, if all are)
    csv_records(path, delimiter, rows) -> (header, records)   # a sample of the first file holding records
    read_csv_header(path, delimiter), read_csv_sample(path, delimiter, rows), libsvm_field_count(path)

--format auto's detection (detect_format) and the check that every file is in the first one's format
(check_same_format) are worker/format_detection.py's.

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
    (i + k) % n (file_residue): still every line exactly once, and small files spread over the workers rather than
    all to worker 0. format_detection.check_same_format refuses files that differ in format from the first. A file of no
    content (no bytes, or whitespace only: Spark's gzip'ed part file of an empty partition) among others holds no
    examples: the first file, wherever one file speaks for all (the header, labels or not), is the first one with
    content.
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
    line_nos holds each example's 1-based physical line (a CSV record's first line; the header is line 1), and
    file_nos its file, among files, the data input's files.
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
from typing import TypeVar

import numpy as np

from worker.batch import Batch, rebatch
from worker.cells import float_values
from worker.criteo import BLANK_CELLS, COMMENT_LINE, EMPTY_PROBLEMS
from worker.datafiles import data_files
from worker.encode import encode_examples
from worker.readers import criteo_reader, csv_reader, libsvm_reader
from worker.readers.csv_records import read_csv_header
from worker.readers.csv_sample import read_csv_sample
from worker.readers.libsvm_reader import libsvm_field_count
from worker.readers.share import BadLines, Cells, ReadStats, Share, is_blank
from worker.schema import Schema

__all__ = [  # the public API; ReadStats and the last three live in worker/readers/, importable from here
    "column_stats",
    "csv_records",
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
    files = tuple(data_files(path))
    stats = stats if stats is not None else ReadStats()

    def stream() -> Iterator[Batch]:
        for k, name in enumerate(files):
            share = Share(
                file_residue(worker_id, k, num_workers),
                num_workers,
                BadLines(name, max_bad_lines, stats, max_bad_share, labels=labeled and not blank_labels),
            )
            for batch in _encoded(name, schema, batch_size, share, labeled, blank_labels):
                batch.file_nos, batch.files = np.full(len(batch), k, dtype=np.int32), files
                yield batch

    return rebatch(stream(), batch_size)


WorkerIds = TypeVar("WorkerIds", int, np.ndarray)  # one worker id, or an array of them


def file_residue(worker_id: WorkerIds, file_index: int, num_workers: int) -> WorkerIds:
    """The residue of the lines worker worker_id of num_workers reads of the file_index-th file (from 0) of a data
    input: its lines j (numbered from 0, a CSV's header left out) with j % num_workers == this, (worker_id +
    file_index) % num_workers. Shifting the residue by the file spreads the files of fewer lines than workers over
    the workers; each line is still read by exactly one worker. read_batches reads by it, idle_workers and
    worker.data.share_examples count by it. worker_id may be an array of ids: their residues, element-wise."""
    return (worker_id + file_index) % num_workers


def idle_workers(file_residues: Sequence[Collection[int]], num_workers: int) -> list[int]:
    """The workers of num_workers whose shares (read_batches, file_residue) of files, in reading order, hold no line
    of data: file_residues, of each file, the residues mod num_workers of its data lines' 0-based indices among its
    lines (linecount.LineCount.per_file_residues; a CSV's, of records: csv_records.csv_data_places)."""
    workers = np.arange(num_workers)
    reads = np.zeros(num_workers, dtype=bool)
    for k, residues in enumerate(file_residues):
        found = np.fromiter(residues, dtype=np.int64, count=len(residues))
        reads |= np.isin(file_residue(workers, k, num_workers), found)
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
