"""A column's cells as ids (worker/encode.py): categorical values hashed or raw, and the bags of multi_hot and
weighted columns."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from worker.batch import Bags
from worker.cells import empty_cell, float_values, raw_ids
from worker.encode_cells import ExampleProblems, shown_cell, source_cells
from worker.features import blank_strings, cat_values, space_ids
from worker.schema_columns import Column


def cat_values_by_source(
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
        arr = source_cells(cells, c, n)
        by_kind.setdefault(arr.dtype.kind, {})[c.source] = arr
    for group in by_kind.values():
        values = cat_values(np.stack(list(group.values()), axis=1))
        out.update({source: values[:, j] for j, source in enumerate(group)})
    return out


def token_ids(
    c: Column, space: int, tokens: np.ndarray, problems: ExampleProblems, example: np.ndarray | None
) -> np.ndarray:
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
                f"column {c.source!r} {what} {shown_cell(tokens[i])}, expected a decimal id below 2**64 - 1"
                for i in at.tolist()
            ],
        )
    return ids


def cell_bags(c: Column, space: int, cells: np.ndarray, problems: ExampleProblems, truncated: np.ndarray) -> Bags:
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
    present = _named(tokens)  # a blank token is no token, as an empty one
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
    return Bags(token_ids(c, space, tokens, problems, example), offsets, weights)


def one_id_bags(c: Column, space: int, hashed: dict[str, np.ndarray], cells: Mapping[str, np.ndarray],
                 weights: np.ndarray, problems: ExampleProblems) -> Bags:  # fmt: skip
    """The bags of a weighted column whose source Parsed.weights holds: example i's one id (its hashed value, or
    its raw cell) with weights[i], or an empty bag where that is 0."""
    present = np.flatnonzero(weights != 0)
    offsets = np.zeros(len(weights) + 1, dtype=np.int64)
    np.cumsum(weights != 0, out=offsets[1:])
    if c.ids == "hashed":
        ids = space_ids(space, hashed[c.source][present])
    else:
        ids = token_ids(c, space, source_cells(cells, c, len(weights))[present], problems, present)
    return Bags(ids, offsets, weights[present])


def _weighted(
    c: Column, tokens: np.ndarray, example: np.ndarray, problems: ExampleProblems
) -> tuple[np.ndarray, np.ndarray]:
    """(id tokens, float32 weights) of id:weight tokens, each with an id neither empty nor blank and a finite weight;
    bad tokens reported (their ids and weights unused)."""
    if len(tokens) == 0:  # every bag empty (np.strings.rpartition fails on an empty array)
        return tokens, np.zeros(0, dtype=np.float32)
    colon = b":" if tokens.dtype.kind == "S" else ":"
    ids, sep, weight_text = np.strings.rpartition(tokens, colon)
    values, missing, ok = float_values(weight_text)
    named = _named(ids)  # a blank id is no id, as an empty one (a bag has no missing id)
    ok &= (sep != empty_cell(sep)) & named & ~missing
    if not ok.all():
        at = np.flatnonzero(~ok)
        message = "expected id:weight with a finite weight"
        problems.add(
            example[at], [f"column {c.source!r} has the token {shown_cell(tokens[i])}, {message}" for i in at.tolist()]
        )
    return ids, np.where(ok, values, 0.0).astype(np.float32)


def _named(strings: np.ndarray) -> np.ndarray:
    """bool, where strings holds one neither empty nor blank (whitespace only)."""
    named = strings != empty_cell(strings)
    named[named] = ~blank_strings(strings[named])
    return named
