"""Training data in three formats, read into Batches: Criteo TSV, CSV with a header, libsvm.

    read_batches(path, fmt, batch_size, *, worker_id=0, num_workers=1, max_bad_lines=0, label_column=None,
                 drop_columns=(), numeric_columns=(), libsvm_fields=None, stats=None) -> Iterator[Batch]

Common to all formats:
  - A path ending in ".gz" is read through gzip.
  - Data lines are numbered from 0, the CSV header excluded (for CSV a "line" is a record, which may span
    several physical lines inside quotes). Worker i of n reads the data lines whose number % n == i, so n
    workers together read every line exactly once.
  - A malformed data line (an empty line included) is skipped and counted in `stats` (ReadStats). A worker
    counts only the bad lines of its share; when its count exceeds max_bad_lines the reader raises ValueError
    "<file> line <L>: <problem>; <k> bad lines, more than --max-bad-lines <max>", L the 1-based physical line
    of the bad line that crossed the limit. Bad lines are counted in file order.
  - Batches hold batch_size good examples each (the last may hold fewer), in file order; probs is None.
  - Every ids row ends with BIAS_ID, like the Criteo ids.

Formats:
  criteo  label TAB I1..I13 TAB C1..C26, exactly as in worker/criteo.py: the same ids and dense features as
          read_criteo. Bad: a column count other than 40, a label other than 0/1, an integer feature that is
          not an int64 integer (the problems are worded as read_criteo words them).
  csv     A header line names the columns (the csv module's default dialect: commas, double-quote quoting;
          UTF-8, a leading BOM ignored). label_column (default: the first column) holds 0 or 1 (any text that
          float() reads as 0 or 1). drop_columns are ignored. numeric_columns go to Batch.dense, float32 of
          log1p(max(x, 0)) in the order given, an empty cell being 0 (dense is None without numeric columns).
          Every other column is categorical: field f = its index among the categorical columns (in header
          order), id = wide_field_ids of f and cat_values(cell) (= features.field_ids(f, ...) for f < 39).
          Bad: a column count other than the header's, a bad label, a numeric cell that is not a finite number.
  libsvm  label id:value id:value ...   (whitespace-separated). Labels 0 or 1, or -1 (-> 0) or +1 (-> 1).
          The k-th feature token of a line is field k, its id wide_field_ids of k and the integer id; a value
          of 0 marks the field missing (the missing id of field k, as for a padded field), any other finite
          value is ignored (CTR libsvm data is one-hot). K, the number of fields, is libsvm_fields, or else the
          number of features on the first good line of the file with at least one feature (the whole file,
          whatever the worker's share, so every worker gets the same K; 0 if no line has any). A line with
          fewer than K features has the missing id in its last fields; one with more is a bad line. Ids are
          integers 0 <= id < 2**64 - 1, written as decimal digits. ids: (n, K + 1); dense is None.
          Bad: a bad label, a token other than id:value, more than K features.

Ids of any number of fields (CSV and libsvm may have more than the 39 Criteo fields): field f < 39 uses
features.field_ids(f, ·); field f >= 39 uses the same formula with salt index f + 1, skipping the bias's
(index 39), so no field's id of 0 equals BIAS_ID.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import math
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from ps.hashing import mix64
from worker.criteo import NUM_COLUMNS, _parse_lines
from worker.features import BIAS_ID, MISSING_CAT, MISSING_INT, NUM_FIELDS, NUM_INT_FIELDS, Batch, cat_values

FORMATS = ("criteo", "csv", "libsvm")

_GOLDEN = 0x9E3779B97F4A7C15  # features.py's per-field salt step
_MISSING = int(MISSING_CAT)
_INT_LO, _INT_HI = int(MISSING_INT), 2**63 - 1  # a Criteo integer feature lies in (_INT_LO, _INT_HI]


@dataclass
class ReadStats:
    """Filled in by read_batches as it reads (after each chunk of up to batch_size lines)."""

    lines_read: int = 0  # data lines of this worker's share read so far, bad ones included
    bad_lines: int = 0  # of which malformed (skipped)
    first_bad: str | None = None  # the first problem: "<file> line <L>: <what was wrong>"


def read_batches(
    path: str | os.PathLike,
    fmt: str,
    batch_size: int,
    *,
    worker_id: int = 0,
    num_workers: int = 1,
    max_bad_lines: int = 0,
    label_column: str | None = None,
    drop_columns: Sequence[str] = (),
    numeric_columns: Sequence[str] = (),
    libsvm_fields: int | None = None,
    stats: ReadStats | None = None,
) -> Iterator[Batch]:
    """Batches of this worker's share of the file (see the module docstring). Arguments are checked here;
    the file (and a CSV header against the column options) when iteration starts."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is unknown; expected one of {list(FORMATS)}")
    if batch_size < 1:
        raise ValueError(f"batch_size is {batch_size}, expected >= 1")
    if num_workers < 1 or not 0 <= worker_id < num_workers:
        raise ValueError(f"worker_id {worker_id} of num_workers {num_workers}: expected 0 <= worker_id < num_workers")
    if max_bad_lines < 0:
        raise ValueError(f"max_bad_lines is {max_bad_lines}, expected >= 0")
    if fmt != "csv" and (label_column is not None or drop_columns or numeric_columns):
        raise ValueError(f"label_column, drop_columns and numeric_columns apply to csv only, not {fmt}")
    if libsvm_fields is not None and (fmt != "libsvm" or libsvm_fields < 0):
        raise ValueError(f"libsvm_fields is {libsvm_fields} for format {fmt}; expected libsvm and >= 0")
    name = os.fspath(path)
    stats = stats if stats is not None else ReadStats()
    share = _Share(worker_id, num_workers, _BadLines(name, max_bad_lines, stats))
    if fmt == "criteo":
        parts = _criteo_parts(name, batch_size, share)
    elif fmt == "libsvm":
        parts = _libsvm_parts(name, batch_size, share, libsvm_fields)
    else:
        parts = _csv_parts(name, batch_size, share, label_column, tuple(drop_columns), tuple(numeric_columns))
    return _rebatch(parts, batch_size)


def wide_field_ids(values: np.ndarray) -> np.ndarray:
    """Ids of uint64 raw values (n, C), column f being field f (any C; see the module docstring)."""
    values = np.asarray(values, dtype=np.uint64)
    f = np.arange(values.shape[-1], dtype=np.uint64)
    salts = (f + np.uint64(1) + (f >= np.uint64(NUM_FIELDS)).astype(np.uint64)) * np.uint64(_GOLDEN)
    with np.errstate(over="ignore"):
        return mix64(mix64(values) ^ salts)


def libsvm_field_count(path: str | os.PathLike) -> int:
    """K of a libsvm file: the feature count of its first good line with at least one feature, else 0."""
    with open_data(os.fspath(path)) as f:
        for line in f:
            parsed = _libsvm_line(line)
            if not isinstance(parsed, str) and parsed[1]:
                return len(parsed[1])
    return 0


# ---------------------------------------------------------------------------------------------------------
# Shared machinery: opening, shares, bad-line accounting, re-batching.


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

    def add(self, line_no: int, problem: str) -> None:
        s = self.stats
        s.bad_lines += 1
        message = f"{self.name} line {line_no}: {problem}"
        if s.first_bad is None:
            s.first_bad = message
        if s.bad_lines > self.limit:
            raise ValueError(f"{message}; {s.bad_lines} bad lines, more than --max-bad-lines {self.limit}")


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


def _rebatch(parts: Iterable[Batch], size: int) -> Iterator[Batch]:
    """Batches of exactly `size` examples (the last may be smaller) from parts of any size, in order."""
    pending: list[Batch] = []
    count = 0
    for part in parts:
        if len(part) == 0:
            continue
        if not pending and len(part) == size:  # the common case: no copy
            yield part
            continue
        pending.append(part)
        count += len(part)
        if count >= size:
            whole = _concat(pending)
            lo = 0
            while count - lo >= size:
                yield _rows(whole, lo, lo + size)
                lo += size
            pending = [_rows(whole, lo, count)] if lo < count else []
            count -= lo
    if pending:
        yield _concat(pending)


def _concat(parts: list[Batch]) -> Batch:
    if len(parts) == 1:
        return parts[0]
    dense = None if parts[0].dense is None else np.concatenate([p.dense for p in parts])
    return Batch(
        labels=np.concatenate([p.labels for p in parts]), ids=np.concatenate([p.ids for p in parts]), dense=dense
    )


def _rows(b: Batch, lo: int, hi: int) -> Batch:
    return Batch(labels=b.labels[lo:hi], ids=b.ids[lo:hi], dense=None if b.dense is None else b.dense[lo:hi])


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------------------
# criteo


def _criteo_parts(name: str, batch_size: int, share: _Share) -> Iterator[Batch]:
    with open_data(name) as f:
        for lines, first in share.chunks(f, batch_size):
            batch = _criteo_chunk(lines, first, share.num_workers, name, share.bad)
            if batch is not None:
                yield batch


def _criteo_chunk(lines: list[bytes], first: int, step: int, name: str, bad: _BadLines) -> Batch | None:
    """The chunk parsed by worker.criteo's vectorized parser; when that fails, each line's column count and
    label and integers are checked in Python, and the lines that pass are parsed together (by bisection
    should the vectorized parser still reject some: it is the judge of what is a good line)."""
    try:
        return _parse_lines(b"".join(lines), name, first)
    except ValueError:
        pass
    good: list[tuple[int, bytes]] = []
    problems: list[tuple[int, str]] = []
    for k, line in enumerate(lines):
        line_no, line = first + k * step, _with_newline(line)
        problem = _criteo_shape_problem(line)
        if problem is None and not _criteo_ints_ok(line):
            try:  # worded by worker.criteo
                _parse_lines(line, name, line_no)
            except ValueError as e:
                problem = str(e).removeprefix(f"{name} line {line_no}: ")
        if problem is None:
            good.append((line_no, line))
        else:
            problems.append((line_no, problem))
    parts = _criteo_bisect(good, name, problems) if good else []
    for line_no, problem in sorted(problems):  # in file order, so the limit is crossed at the right line
        bad.add(line_no, problem)
    return _concat(parts) if parts else None


def _criteo_bisect(lines: list[tuple[int, bytes]], name: str, problems: list[tuple[int, str]]) -> list[Batch]:
    """Parsed Batches of the lines that parse (in order); the others' problems appended to `problems`. A block
    that fails is halved, so b bad lines among n cost O(b log n) vectorized parses."""
    try:
        return [_parse_lines(b"".join(line for _, line in lines), name, lines[0][0])]
    except ValueError as e:
        if len(lines) == 1:
            line_no = lines[0][0]
            problems.append((line_no, str(e).removeprefix(f"{name} line {line_no}: ")))
            return []
    mid = len(lines) // 2
    return _criteo_bisect(lines[:mid], name, problems) + _criteo_bisect(lines[mid:], name, problems)


def _criteo_ints_ok(line: bytes) -> bool:
    """Whether the integer columns of a line of 40 columns hold int64 integers (Python's int() syntax)."""
    try:
        values = [int(s) for s in line.split(b"\t", NUM_INT_FIELDS + 1)[1 : NUM_INT_FIELDS + 1] if s]
    except ValueError:
        return False
    return all(_INT_LO < v <= _INT_HI for v in values)


def _with_newline(line: bytes) -> bytes:
    return line if line.endswith(b"\n") else line + b"\n"


def _criteo_shape_problem(line: bytes) -> str | None:
    """What is wrong with a line's column count or label (worded as read_criteo words it), or None."""
    body = line[:-1]  # the line ends with "\n"
    if body.endswith(b"\r"):
        body = body[:-1]
    columns = body.count(b"\t") + 1
    if columns != NUM_COLUMNS:
        return f"{columns} tab-separated columns, expected {NUM_COLUMNS}"
    label = body[: body.index(b"\t")].rstrip(b"\0")  # numpy's bytes arrays drop trailing NULs
    if label not in (b"0", b"1"):
        return f"label {_text(label)!r}, expected '0' or '1'"
    return None


# ---------------------------------------------------------------------------------------------------------
# libsvm

_LIBSVM_LABELS = {b"0": 0.0, b"1": 1.0, b"-1": 0.0, b"+1": 1.0}


def _libsvm_parts(name: str, batch_size: int, share: _Share, fields: int | None) -> Iterator[Batch]:
    k_fields = libsvm_field_count(name) if fields is None else fields
    labels: list[float] = []
    rows: list[list[int]] = []
    with open_data(name) as f:
        for lines, first in share.chunks(f, batch_size):
            for k, line in enumerate(lines):
                parsed = _libsvm_line(line)
                if isinstance(parsed, str):
                    share.bad.add(first + k * share.num_workers, parsed)
                elif len(parsed[1]) > k_fields:
                    share.bad.add(
                        first + k * share.num_workers, f"{len(parsed[1])} features, more than {k_fields} fields"
                    )
                else:
                    labels.append(parsed[0])
                    rows.append(parsed[1])
            if labels:
                yield _libsvm_batch(labels, rows, k_fields)
                labels, rows = [], []


def _libsvm_line(line: bytes) -> tuple[float, list[int]] | str:
    """(label, the raw value of each feature token, MISSING_CAT for a value of 0), or what is wrong."""
    tokens = line.split()
    if not tokens:
        return "empty line"
    label = _LIBSVM_LABELS.get(tokens[0])
    if label is None:
        try:
            v = float(tokens[0])
        except ValueError:
            v = math.nan
        if v not in (0.0, 1.0, -1.0):
            return f"label {_text(tokens[0])!r}, expected 0, 1, -1 or +1"
        label = float(v == 1.0)
    values = []
    for tok in tokens[1:]:
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


def _libsvm_batch(labels: list[float], rows: list[list[int]], k_fields: int) -> Batch:
    n = len(rows)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.intp, count=n)
    values = np.full((n, k_fields), MISSING_CAT, dtype=np.uint64)
    present = np.arange(k_fields)[None, :] < lengths[:, None]
    values[present] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.uint64, count=int(lengths.sum()))
    ids = np.empty((n, k_fields + 1), dtype=np.uint64)
    ids[:, :k_fields] = wide_field_ids(values)
    ids[:, k_fields] = BIAS_ID
    return Batch(labels=np.array(labels, dtype=np.float32), ids=ids)


# ---------------------------------------------------------------------------------------------------------
# csv


def _csv_columns(
    name: str, header: list[str], label_column: str | None, drop: tuple[str, ...], numeric: tuple[str, ...]
) -> tuple[int, list[int], list[int]]:
    """(label index, numeric indices in the order given, categorical indices in header order)."""
    named = ([label_column] if label_column is not None else []) + list(drop) + list(numeric)
    unknown = [c for c in dict.fromkeys(named) if c not in header]
    if unknown:
        raise ValueError(f"{name}: columns {unknown} are not in the header; its columns are {header}")
    ambiguous = [c for c in dict.fromkeys(named) if header.count(c) > 1]
    if ambiguous:
        raise ValueError(f"{name}: columns {ambiguous} appear more than once in the header {header}")
    if not header:
        raise ValueError(f"{name}: the header line names no columns")
    label = header.index(label_column) if label_column is not None else 0
    roles = {"label": {header[label]}, "drop": set(drop), "numeric": set(numeric)}
    for a, b in (("label", "drop"), ("label", "numeric"), ("drop", "numeric")):
        if roles[a] & roles[b]:
            raise ValueError(f"{name}: columns {sorted(roles[a] & roles[b])} are both {a} and {b} columns")
    numeric_at = [header.index(c) for c in numeric]
    skip = {label, *numeric_at, *(header.index(c) for c in drop)}
    return label, numeric_at, [i for i in range(len(header)) if i not in skip]


def _csv_parts(
    name: str, batch_size: int, share: _Share, label_column: str | None, drop: tuple[str, ...], numeric: tuple[str, ...]
) -> Iterator[Batch]:
    bad, step, mine = share.bad, share.num_workers, share.worker_id
    with open_data(name) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape", newline="")
        reader = csv.reader(text)
        header = next(reader, None)
        if header is None:
            return
        label_at, numeric_at, cat_at = _csv_columns(name, header, label_column, drop, numeric)
        labels: list[float] = []
        nums: list[list[float]] = []
        cats: list[list[str]] = []
        end = reader.line_num
        for index in itertools.count():
            start = end + 1  # the record's first physical line
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:  # e.g. a field over the csv module's size limit
                row = e
            end = reader.line_num
            if index % step != mine:
                continue
            bad.stats.lines_read += 1
            problem, values = _csv_problem(row, header, label_at, numeric_at)
            if problem is not None:
                bad.add(start, problem)
                continue
            labels.append(float(row[label_at]))
            nums.append(values)
            cats.append([row[i] for i in cat_at])
            if len(labels) == batch_size:
                yield _csv_batch(labels, nums, cats, len(numeric_at), len(cat_at))
                labels, nums, cats = [], [], []
        if labels:
            yield _csv_batch(labels, nums, cats, len(numeric_at), len(cat_at))


def _csv_problem(row, header: list[str], label_at: int, numeric_at: list[int]) -> tuple[str | None, list[float]]:
    """(what is wrong with the record or None, its numeric values)."""
    if isinstance(row, csv.Error):
        return f"unreadable CSV: {row}", []
    if not row:
        return "empty line", []
    if len(row) != len(header):
        return f"{len(row)} columns, expected {len(header)} as in the header", []
    label = row[label_at]
    if _number(label) not in (0.0, 1.0):
        return f"label {label!r}, expected 0 or 1", []
    values = []
    for i in numeric_at:
        cell = row[i]
        v = _number(cell) if cell.strip() else 0.0
        if not math.isfinite(v):
            return f"numeric column {header[i]!r} is {cell!r}, expected a finite number or empty", []
        values.append(v)
    return None, values


def _number(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return math.nan


def _csv_batch(
    labels: list[float], nums: list[list[float]], cats: list[list[str]], n_numeric: int, n_cat: int
) -> Batch:
    n = len(labels)
    ids = np.empty((n, n_cat + 1), dtype=np.uint64)
    ids[:, :n_cat] = wide_field_ids(cat_values(np.array(cats, dtype=np.str_).reshape(n, n_cat)))
    ids[:, n_cat] = BIAS_ID
    dense = None
    if n_numeric:
        x = np.array(nums, dtype=np.float64).reshape(n, n_numeric)
        dense = np.log1p(np.maximum(x, 0.0)).astype(np.float32)
    return Batch(labels=np.array(labels, dtype=np.float32), ids=ids, dense=dense)
