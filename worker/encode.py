"""Cells of a data file -> a Batch, as a schema (worker/schema.py) says.

    encode_examples(schema, labels, cells, parsed=None) -> Encoded(batch, bad, problems, truncated_bags)
    encode(schema, labels, cells) -> Batch                  # ValueError at the first bad example
    parsed_sources(schema) -> (int, cat, float sources)     # what a Parsed may hold

    labels  float32 (n,) in {0, 1}
    cells   {source column: str or bytes array (n,)}, one cell per example; "" is an empty (missing) cell
    parsed  Parsed: sources the caller has already read as integers (cells.int_values), categorical values
            (features.cat_values) or numbers (cells.float_values); their cells are not read

Per column, in schema order (the Batch's fields: the sparse columns, then BIAS_FIELD with
Bags.one_per_example(features.BIAS_ID); dense: float32 (n, D) of the numeric features, None when D = 0); a
number, an integer, a raw id and a missing cell are what worker/cells.py says they are:

    categorical  hashed: features.space_ids(space, features.cat_values(cell)); raw: the raw id (cells.raw_ids)
    multi_hot    the cell split at the separator; empty tokens dropped; the first max_length tokens kept (a bag
                 cut so counts in truncated_bags); each token an id as for categorical; an empty bag is allowed
    weighted     as multi_hot, each token id:weight split at its last ":", the id non-empty, the weight a
                 finite number (weights float32); a source in parsed.weights: one id an example (read as for
                 categorical) with its weight, none where that is 0
    numeric      a number or a missing cell (cells.float_values); log_buckets: an integer or a missing cell
                 (cells.int_values); then log: log(1 + max(x, 0)); none: x;
                 standardize: (x - mean) / std; missing -> 0 for all three; bucketize: space_ids(space, b), b = the number of boundaries <= x,
                 missing -> b = 2**64 - 1; log_buckets: space_ids(space, features.int_bucket(x)); a time
                 transform (<format>_hour, <format>_weekday): space_ids(space, its hour or weekday), a number
                 that is no time of the format a problem (timestamps.time_parts; iso: a text that is no date and
                 time, timestamps.iso_parts), missing -> 2**64 - 1

An example with a cell that breaks these rules is bad: it is left out of the Batch, and `problems` says what
was wrong (its first problem in column order). Tokens past max_length are dropped unread. Work is vectorized
per column: categorical and numeric cells with numpy string ops, bags by splitting the joined cells once; the
ids of all one-id columns (categorical hashed, bucketized) are hashed together, in one space_ids call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from worker.batch import Bags, Batch
from worker.cells import FLOAT32_MAX, empty_cell, float_values, int_values, raw_ids
from worker.features import BIAS_ID, MISSING_CAT, MISSING_INT, cat_values, int_bucket, space_ids
from worker.models.spec import BIAS_FIELD
from worker.schema import Schema
from worker.schema_columns import TIME_TRANSFORMS, Column
from worker.timestamps import TEXT_TIME_FORMATS, iso_parts, time_parts

_INT_RANGE = f"({MISSING_INT}, {np.iinfo(np.int64).max}]"


@dataclass
class Encoded:
    """batch: the good examples in input order; bad: int64 (b,) the input indices of the others, ascending;
    problems: what was wrong with each of them; truncated_bags: bags of the good examples cut to max_length."""

    batch: Batch
    bad: np.ndarray
    problems: list[str]
    truncated_bags: int


@dataclass
class Parsed:
    """Sources read before encode_examples, as it would read them: ints {source: int64 (n,)} as int_values
    gives them, of cells that are all ok (MISSING_INT where empty); cats {source: uint64 (n,)} as
    features.cat_values gives them; floats {source: (float64 values, missing) (n,)} as float_values gives them,
    of cells that are all ok; weights {source: float32 (n,)}: the source's cell is one id (in cats, or its cell
    where ids are raw) of this weight, or none where the weight is 0, which a weighted column reads as a bag of
    that one id, or an empty bag (a libsvm token's id and value: worker/readers/libsvm_reader.py)."""

    ints: dict[str, np.ndarray] = field(default_factory=dict)
    cats: dict[str, np.ndarray] = field(default_factory=dict)
    floats: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    weights: dict[str, np.ndarray] = field(default_factory=dict)


def parsed_sources(schema: Schema) -> tuple[set[str], set[str], set[str]]:
    """(the sources encode_examples reads with int_values: those of log_buckets columns; those it reads with
    features.cat_values: those of hashed categorical columns; those it reads with float_values: those of the
    other numeric columns, less the int ones and those of text times: iso_*), which a Parsed may hold."""
    ints = {c.source for c in schema.columns if c.transform == "log_buckets"}
    cats = {c.source for c in schema.columns if c.kind == "categorical" and c.ids == "hashed"}
    floats = {c.source for c in schema.columns if c.kind == "numeric" and not _text_time(c)} - ints
    return ints, cats, floats


def encode(schema: Schema, labels: np.ndarray, cells: dict[str, np.ndarray]) -> Batch:
    """The Batch of n examples; ValueError naming the first bad example and its problem."""
    out = encode_examples(schema, labels, cells)
    if len(out.bad):
        raise ValueError(f"example {int(out.bad[0])}: {out.problems[0]}")
    return out.batch


def encode_examples(
    schema: Schema, labels: np.ndarray, cells: Mapping[str, np.ndarray], parsed: Parsed | None = None
) -> Encoded:
    """The Batch of the good examples, and which were bad and why (see the module docstring)."""
    labels = np.asarray(labels, dtype=np.float32)
    n = len(labels)
    parsed = parsed if parsed is not None else Parsed()
    problems = _Problems(n)
    floats = {s: (values, missing) for s, (values, missing) in parsed.floats.items()}
    _checked({s: v for s, (v, _) in floats.items()}, np.float64, n)
    _checked({s: m for s, (_, m) in floats.items()}, np.bool_, n)
    numbers = _Numbers(schema, cells, n, problems, _checked(parsed.ints, np.int64, n), floats)
    spaces = schema.id_spaces()
    fields: dict[str, Bags] = {}
    dense_columns = schema.dense_columns()
    dense = np.empty((n, len(dense_columns)), dtype=np.float32) if dense_columns else None
    truncated = np.zeros(n, dtype=np.int64)
    one_id = set(_checked(parsed.weights, np.float32, n))  # weighted columns of one id an example
    hashed = _cat_values_by_source(
        [c for c in schema.columns if c.ids == "hashed" and (c.kind == "categorical" or c.source in one_id)],
        cells,
        n,
        _checked(parsed.cats, np.uint64, n),
    )
    hashed_values: dict[str, tuple[int, np.ndarray]] = {}  # one-id columns: (space, uint64 values), hashed at once
    for c in schema.columns:
        space = spaces.get(c.id_space, -1)
        if not c.is_sparse:
            dense[:, dense_columns.index(c)] = numbers.dense_values(c)
        elif c.kind == "numeric":
            hashed_values[c.name] = (space, numbers.bucket_values(c))
        elif c.source in hashed and c.kind == "categorical":
            hashed_values[c.name] = (space, hashed[c.source])
        elif c.kind == "categorical":
            fields[c.name] = Bags.one_per_example(_ids(c, space, _cells(cells, c, n), problems, None))
        elif c.kind == "weighted" and c.source in one_id:
            fields[c.name] = _one_id_bags(c, space, hashed, cells, parsed.weights[c.source], problems)
        else:
            fields[c.name] = _bags(c, space, _cells(cells, c, n), problems, truncated)
    if hashed_values:
        ids = space_ids(
            [space for space, _ in hashed_values.values()], np.stack([v for _, v in hashed_values.values()])
        )
        fields.update({name: Bags.one_per_example(row) for name, row in zip(hashed_values, ids)})
    fields = {c.name: fields[c.name] for c in schema.columns if c.is_sparse}  # in schema order
    fields[BIAS_FIELD] = Bags.one_per_example(np.full(n, BIAS_ID, dtype=np.uint64))
    batch = Batch(labels, fields, dense)
    if not problems.bad.any():
        return Encoded(batch, np.zeros(0, dtype=np.int64), [], int(truncated.sum()))
    good = np.flatnonzero(~problems.bad)
    bad = np.flatnonzero(problems.bad)
    return Encoded(batch.take(good), bad, [problems.first[i] for i in bad.tolist()], int(truncated[good].sum()))


class _Problems:
    """The first problem of each bad example."""

    def __init__(self, n: int):
        self.bad = np.zeros(n, dtype=bool)
        self.first: dict[int, str] = {}

    def add(self, examples: np.ndarray, messages: list[str]) -> None:
        for i, message in zip(np.asarray(examples).tolist(), messages):
            if i not in self.first:
                self.first[i] = message
                self.bad[i] = True


def _checked(values: dict[str, np.ndarray], dtype: type, n: int) -> dict[str, np.ndarray]:
    """Parsed values, each checked to be a (n,) array of dtype."""
    for source, v in values.items():
        if v.dtype != dtype or v.shape != (n,):
            raise ValueError(f"parsed values of {source!r} are {v.dtype} {v.shape}, expected {np.dtype(dtype)} ({n},)")
    return values


def _cells(cells: Mapping[str, np.ndarray], c: Column, n: int) -> np.ndarray:
    if c.source not in cells:
        raise ValueError(f"column {c.name!r} reads {c.source!r}, which is not among the cells {sorted(cells)}")
    arr = np.asarray(cells[c.source])
    if arr.dtype.kind not in "SU":
        arr = arr.astype(np.str_)
    if arr.shape != (n,):
        raise ValueError(f"cells of {c.source!r} have shape {arr.shape}, expected ({n},)")
    return arr


def _cat_values_by_source(
    columns: list[Column], cells: Mapping[str, np.ndarray], n: int, parsed: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """{source: features.cat_values of its cells} for the sources of the columns, taken from parsed where it
    holds them, else in one call per dtype kind (cat_values costs a pass per character position, whatever the
    number of columns)."""
    by_kind: dict[str, dict[str, np.ndarray]] = {}
    out = {c.source: parsed[c.source] for c in columns if c.source in parsed}
    for c in columns:
        if c.source in parsed:
            continue
        arr = _cells(cells, c, n)
        by_kind.setdefault(arr.dtype.kind, {})[c.source] = arr
    for group in by_kind.values():
        values = cat_values(np.stack(list(group.values()), axis=1))
        out.update({source: values[:, j] for j, source in enumerate(group)})
    return out


def _shown(cell: str | bytes) -> str:
    """A cell for a message: its text (UTF-8, bad bytes replaced), cut at 80 characters."""
    text = cell.decode("utf-8", "replace") if isinstance(cell, bytes) else str(cell)
    return repr(text) if len(text) <= 80 else repr(text[:80]) + f"... ({len(text)} characters)"


# ---------------------------------------------------------------------------------------------------------
# ids


def _ids(c: Column, space: int, tokens: np.ndarray, problems: _Problems, example: np.ndarray | None) -> np.ndarray:
    """uint64 ids of tokens (cells, or bag tokens of the given examples): hashed in `space`, or raw decimals."""
    if c.ids == "hashed":
        return space_ids(space, cat_values(tokens))
    ids, ok = raw_ids(tokens)
    if not ok.all():
        at = np.flatnonzero(~ok)
        examples = at if example is None else example[at]
        what = "is" if example is None else "has the id"
        problems.add(
            examples,
            [
                f"column {c.source!r} {what} {_shown(tokens[i])}, expected a decimal id below 2**64 - 1"
                for i in at.tolist()
            ],
        )
    return ids


def _bags(c: Column, space: int, cells: np.ndarray, problems: _Problems, truncated: np.ndarray) -> Bags:
    """A bag per cell (see the module docstring); truncated[i] += 1 for each example whose bag was cut."""
    n = len(cells)
    if n == 0:
        return Bags(
            np.zeros(0, np.uint64), np.zeros(1, np.int64), np.zeros(0, np.float32) if c.kind == "weighted" else None
        )
    sep = c.separator.encode() if cells.dtype.kind == "S" else c.separator
    per_cell = np.strings.count(cells, sep) + 1
    tokens = np.array(sep.join(cells.tolist()).split(sep), dtype=cells.dtype.kind)
    example = np.repeat(np.arange(n, dtype=np.int64), per_cell)
    present = tokens != empty_cell(tokens)
    tokens, example = tokens[present], example[present]
    lengths = np.bincount(example, minlength=n)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    position = np.arange(len(tokens), dtype=np.int64) - starts[example]
    cut = lengths > c.max_length
    if cut.any():
        truncated += cut
        kept = position < c.max_length
        tokens, example = tokens[kept], example[kept]
        lengths = np.minimum(lengths, c.max_length)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    weights = None
    if c.kind == "weighted":
        tokens, weights = _weighted(c, tokens, example, problems)
    return Bags(_ids(c, space, tokens, problems, example), offsets, weights)


def _one_id_bags(c: Column, space: int, hashed: dict[str, np.ndarray], cells: Mapping[str, np.ndarray],
                 weights: np.ndarray, problems: _Problems) -> Bags:  # fmt: skip
    """The bags of a weighted column whose source Parsed.weights holds: example i's one id (its hashed value, or
    its raw cell) with weights[i], or an empty bag where that is 0."""
    present = np.flatnonzero(weights != 0)
    offsets = np.zeros(len(weights) + 1, dtype=np.int64)
    np.cumsum(weights != 0, out=offsets[1:])
    if c.ids == "hashed":
        ids = space_ids(space, hashed[c.source][present])
    else:
        ids = _ids(c, space, _cells(cells, c, len(weights))[present], problems, present)
    return Bags(ids, offsets, weights[present])


def _weighted(c: Column, tokens: np.ndarray, example: np.ndarray, problems: _Problems) -> tuple[np.ndarray, np.ndarray]:
    """(id tokens, float32 weights) of id:weight tokens; bad tokens reported (their ids and weights unused)."""
    if len(tokens) == 0:  # every bag empty (np.strings.rpartition fails on an empty array)
        return tokens, np.zeros(0, dtype=np.float32)
    colon = b":" if tokens.dtype.kind == "S" else ":"
    ids, sep, weight_text = np.strings.rpartition(tokens, colon)
    values, missing, ok = float_values(weight_text)
    ok &= (sep != empty_cell(sep)) & (ids != empty_cell(ids)) & ~missing
    if not ok.all():
        at = np.flatnonzero(~ok)
        message = "expected id:weight with a finite weight"
        problems.add(
            example[at], [f"column {c.source!r} has the token {_shown(tokens[i])}, {message}" for i in at.tolist()]
        )
    return ids, np.where(ok, values, 0.0).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------
# numbers


_TIME_EXPECTED = {"yymmddhh": "a time YYMMDDHH (14102100: 2014-10-21, hour 00; a month 01-12, a day of it, an "
                               "hour 00-23)",
                  "unix": "a time in unix seconds (an integer from 0 to 9999999999: not milliseconds)",
                  "iso": "a date and time YYYY-MM-DD HH:MM:SS or YYYY-MM-DDTHH:MM:SS (minutes, seconds and a zone "
                         "optional; a valid date, an hour 00-23)"}  # fmt: skip


def _text_time(c: Column) -> bool:
    """Whether a column reads its cells as a time written as text (timestamps.TEXT_TIME_FORMATS), not a number."""
    return c.transform in TIME_TRANSFORMS and c.transform.rpartition("_")[0] in TEXT_TIME_FORMATS


class _Numbers:
    """The parsed numeric sources of one call, each parsed once: as integers where a log_buckets column reads
    the source (taken from `ints` where it holds them, else all of them in one int_values call per dtype kind; a
    float view of them then serves the other transforms), else as floats. A source's problems are reported
    when a column first reads it. The integer sources' buckets and float views are computed for all of them
    at once, when a column first needs one. Float sources in `floats` are taken from it (all ok)."""

    def __init__(self, schema: Schema, cells: Mapping[str, np.ndarray], n: int, problems: _Problems,
                 ints: dict[str, np.ndarray], floats: dict[str, tuple[np.ndarray, np.ndarray]]):  # fmt: skip
        self.cells, self.n, self.problems = cells, n, problems
        self.parsed_ints: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        by_kind: dict[str, dict[str, np.ndarray]] = {}
        for c in schema.columns:
            if c.transform == "log_buckets" and c.source in ints:
                self.parsed_ints[c.source] = (ints[c.source], np.ones(n, dtype=bool))
            elif c.transform == "log_buckets":
                arr = _cells(cells, c, n)
                by_kind.setdefault(arr.dtype.kind, {})[c.source] = arr
        for group in by_kind.values():
            values, ok = int_values(np.stack(list(group.values()), axis=1))
            self.parsed_ints.update({source: (values[:, j], ok[:, j]) for j, source in enumerate(group)})
        self.ints: dict[str, np.ndarray] = {}
        self.floats = {s: v for s, v in floats.items() if s not in self.parsed_ints}
        self.buckets: dict[str, np.ndarray] = {}
        self.int_floats: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.text_times: dict[str, tuple[np.ndarray, ...]] = {}  # iso_parts of a text time's source

    def _int(self, c: Column) -> np.ndarray:
        if c.source not in self.ints:
            values, ok = self.parsed_ints[c.source]
            if not ok.all():
                cells, at = self.cells[c.source], np.flatnonzero(~ok)
                expected = f"expected empty, NA (missing) or a base-10 integer in {_INT_RANGE}"
                self.problems.add(at, [f"integer column {c.source!r} is {_shown(cells[i])}, {expected}" for i in at])
            self.ints[c.source] = values
        return self.ints[c.source]

    def _all_ints(self) -> np.ndarray:
        """int64 (k, n): the values of the k integer sources (MISSING_INT where not ok), in parsed_ints order."""
        return np.stack([values for values, _ in self.parsed_ints.values()]).reshape(len(self.parsed_ints), self.n)

    def _float(self, c: Column) -> tuple[np.ndarray, np.ndarray]:
        """(float64 values, missing)."""
        if c.source not in self.floats:
            if c.source in self.parsed_ints:
                self._int(c)  # its problems
                if not self.int_floats:
                    ints = self._all_ints()
                    missing = ints == MISSING_INT
                    floats = np.where(missing, 0, ints).astype(np.float64)
                    self.int_floats = {s: (floats[j], missing[j]) for j, s in enumerate(self.parsed_ints)}
                self.floats[c.source] = self.int_floats[c.source]
            else:
                cells = _cells(self.cells, c, self.n)
                values, missing, ok = float_values(cells)
                if not ok.all():
                    at = np.flatnonzero(~ok)
                    self.problems.add(
                        at,
                        [
                            f"numeric column {c.source!r} is {_shown(cells[i])}, expected a finite float32 number "
                            "(|x| <= 3.4e38) or empty"
                            for i in at.tolist()
                        ],
                    )
                self.floats[c.source] = (values, missing)
        return self.floats[c.source]

    def bucket_values(self, c: Column) -> np.ndarray:
        """uint64 bucket values of a bucketize or log_buckets column, hours or weekdays of a time column."""
        if c.transform in TIME_TRANSFORMS:
            return self._time_values(c)
        if c.transform == "log_buckets":
            self._int(c)  # its problems
            if not self.buckets:
                self.buckets = dict(zip(self.parsed_ints, int_bucket(self._all_ints())))
            return self.buckets[c.source]
        x, missing = self._float(c)
        b = np.searchsorted(np.asarray(c.boundaries), x, side="right").astype(np.uint64)
        b[missing] = MISSING_CAT
        return b

    def _time_values(self, c: Column) -> np.ndarray:
        fmt, _, part = c.transform.rpartition("_")
        if _text_time(c):
            if c.source not in self.text_times:
                self.text_times[c.source] = iso_parts(_cells(self.cells, c, self.n))
            hour, weekday, ok, missing = self.text_times[c.source]
        else:
            x, missing = self._float(c)
            hour, weekday, ok = time_parts(x, fmt)
        bad = ~ok & ~missing
        if bad.any():
            at, cells = np.flatnonzero(bad), self.cells.get(c.source)
            expected = _TIME_EXPECTED[fmt]
            self.problems.add(at, [f"time column {c.source!r} is {_shown(cells[i]) if cells is not None else x[i]}, "
                                   f"expected {expected} or empty" for i in at])  # fmt: skip
        out = (hour if part == "hour" else weekday).astype(np.uint64)
        out[missing | bad] = MISSING_CAT
        return out

    def dense_values(self, c: Column) -> np.ndarray:
        """float64 (n,) of a log, none or standardize column."""
        x, missing = self._float(c)
        if c.transform == "log":
            out = np.log1p(np.maximum(x, 0.0))
        elif c.transform == "standardize":
            if c.mean is None or c.std is None:
                raise ValueError(f"standardize column {c.name!r} has no mean and std: Schema.with_stats gives them")
            out = (x - c.mean) / c.std
        else:
            out = x.copy()
        out[missing] = 0.0
        too_big = ~(np.abs(out) <= FLOAT32_MAX)  # past it, inf in float32
        if too_big.any():
            at = np.flatnonzero(too_big)
            cells = self.cells.get(c.source)
            self.problems.add(at, [f"numeric column {c.source!r} is {_shown(cells[i]) if cells is not None else x[i]}:"
                                   f" its {c.transform} feature {out[i]:.3g} is past float32's range" for i in at])  # fmt: skip
            out[too_big] = 0.0
        return out
