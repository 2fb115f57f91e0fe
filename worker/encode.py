"""Cells of a data file -> a Batch, as a schema (worker/schema.py) says.

    encode_examples(schema, labels, cells, parsed=None) -> Encoded(batch, bad, problems, truncated_bags)
    encode(schema, labels, cells) -> Batch                  # ValueError at the first bad example
    parsed_sources(schema) -> (int, cat, float sources)     # what a Parsed may hold

    labels  float32 (n,) in {0, 1}
    cells   {source column: str or bytes array (n,)}, one cell per example; "" is an empty (missing) cell, and so
            is a blank one (whitespace only: features.blank_strings)
    parsed  Parsed: sources the caller has already read as integers (cells.int_values), categorical values
            (features.cat_values) or numbers (cells.float_values); their cells are not read

Per column, in schema order (the Batch's fields: the sparse columns, then BIAS_FIELD with
Bags.one_per_example(features.BIAS_ID); dense: float32 (n, D) of the numeric features, None when D = 0); a
number, an integer, a raw id and a missing cell are what worker/cells.py says they are:

    categorical  hashed: features.space_ids(space, features.cat_values(cell)); raw: the raw id (cells.raw_ids);
                 an empty or blank cell: the value MISSING_CAT, the column's missing id
    multi_hot    the cell split at the separator; empty and blank tokens dropped; the first max_length tokens kept
                 (a bag cut so counts in truncated_bags); each token an id as for categorical; an empty bag is allowed
    weighted     as multi_hot, each token id:weight split at its last ":", the id neither empty nor blank (a
                 bag has no missing id), the weight a finite number (weights float32); a source in
                 parsed.weights: one id an example (read as for categorical) with its weight, none where that is 0
    numeric      a number or a missing cell (cells.float_values); log_buckets: an integer or a missing cell
                 (cells.int_values); then log: log(1 + max(x, 0)); none: x;
                 standardize: (x - mean) / std; missing -> 0 for all three; bucketize: space_ids(space, b), b = the
                 number of boundaries <= x,
                 missing -> b = 2**64 - 1; log_buckets: space_ids(space, features.int_bucket(x)); a time
                 transform (<format>_hour, <format>_weekday): space_ids(space, its hour or weekday), a number
                 that is no time of the format a problem (timestamps.time_parts; iso: a text that is no date and
                 time, timestamps.iso_parts), missing -> 2**64 - 1

An example with a cell that breaks these rules is bad: it is left out of the Batch, and `problems` says what
was wrong (its first problem in column order). Tokens past max_length are dropped unread. Work is vectorized
per column: categorical and numeric cells with numpy string ops, bags by splitting the joined cells once; the
ids of all one-id columns (categorical hashed, bucketized) are hashed together, in one space_ids call. A column's
cells are checked and shown by encode_cells.py, read as ids and bags by encode_ids.py, and as numbers by
encode_numbers.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from worker.batch import Bags, Batch
from worker.encode_cells import ExampleProblems, source_cells
from worker.encode_ids import cat_values_by_source, cell_bags, one_id_bags, token_ids
from worker.encode_numbers import NumericSources, reads_text_time
from worker.features import BIAS_ID, space_ids
from worker.models.spec import BIAS_FIELD
from worker.schema import Schema


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
    floats = {c.source for c in schema.columns if c.kind == "numeric" and not reads_text_time(c)} - ints
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
    problems = ExampleProblems(n)
    floats = {s: (values, missing) for s, (values, missing) in parsed.floats.items()}
    _checked({s: v for s, (v, _) in floats.items()}, np.float64, n)
    _checked({s: m for s, (_, m) in floats.items()}, np.bool_, n)
    numbers = NumericSources(schema, cells, n, problems, _checked(parsed.ints, np.int64, n), floats)
    spaces = schema.id_spaces()
    fields: dict[str, Bags] = {}
    dense_columns = schema.dense_columns()
    dense = np.empty((n, len(dense_columns)), dtype=np.float32) if dense_columns else None
    truncated = np.zeros(n, dtype=np.int64)
    one_id = set(_checked(parsed.weights, np.float32, n))  # weighted columns of one id an example
    hashed = cat_values_by_source(
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
            fields[c.name] = Bags.one_per_example(token_ids(c, space, source_cells(cells, c, n), problems, None))
        elif c.kind == "weighted" and c.source in one_id:
            fields[c.name] = one_id_bags(c, space, hashed, cells, parsed.weights[c.source], problems)
        else:
            fields[c.name] = cell_bags(c, space, source_cells(cells, c, n), problems, truncated)
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


def _checked(values: dict[str, np.ndarray], dtype: type, n: int) -> dict[str, np.ndarray]:
    """Parsed values, each checked to be a (n,) array of dtype."""
    for source, v in values.items():
        if v.dtype != dtype or v.shape != (n,):
            raise ValueError(f"parsed values of {source!r} are {v.dtype} {v.shape}, expected {np.dtype(dtype)} ({n},)")
    return values
