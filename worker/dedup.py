"""Dedup of a push's ids: unique ids, their summed gradients and counts, and the way back to the caller's order.

The client dedups once per call (`np.unique`), sums duplicate ids' grads, shows and clicks, and sends each unique
id once; ids that are unique and increasing already are taken as they are. The values of what it sends are
checked as a shard checks them (ps.rows.pushcheck), before any shard gets a part. Pure numpy (and compiled
loops): no gRPC, no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numba
import numpy as np

from ps import wire
from ps.errors import InvalidArgumentError
from ps.rows.finite import first_non_finite
from ps.rows.pushcheck import check_push_values


class PushItem(NamedTuple):
    """One table's push in push_many: ids (n,) with grads (n, dim), one show per occurrence and clicks (n,) summed
    per id the same way (None: no clicks); or, with shows (n,), ids already unique and every count given per id."""

    table: str
    ids: np.ndarray
    grads: np.ndarray
    clicks: np.ndarray | None = None
    shows: np.ndarray | None = None


@numba.njit(nogil=True, cache=True)
def segment_sum(inverse: np.ndarray, grads: np.ndarray, out: np.ndarray) -> None:
    """out[inverse[i], :] += grads[i, :]."""
    dim = grads.shape[1]
    for i in range(inverse.shape[0]):
        u = inverse[i]
        for j in range(dim):
            out[u, j] += grads[i, j]


def sum_duplicates(ids: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique sorted ids, their summed grads)."""
    uniq, inverse = np.unique(ids, return_inverse=True)
    out = np.zeros((len(uniq), grads.shape[1]), dtype=np.float32)
    segment_sum(inverse.ravel().astype(np.int64), np.ascontiguousarray(grads, dtype=np.float32), out)
    return uniq, out


def _per_id(values, n: int, table: str, what: str) -> np.ndarray:
    """values as n float32, one per id (a single value is used for every id); ValueError for another length."""
    flat = np.asarray(values, dtype=np.float32).ravel()
    if len(flat) not in (1, n):
        raise ValueError(f"push to {table!r} has {len(flat)} {what} for {n} ids")
    return np.broadcast_to(flat, (n,)) if len(flat) != n else flat


def push_arrays(
    table: str,
    ids: np.ndarray,
    grads: np.ndarray,
    clicks: np.ndarray | None,
    shows: np.ndarray | None,
    dim: int,
) -> tuple:
    """(unique ids, their grads (n, dim), shows (n,), clicks (n,), all float32, and where each given id's row is
    in them or None) of one push item, as Client.push_many sends it. shows None: each occurrence of an id is one
    show and duplicates are summed; given: ids must be unique (ValueError) and everything is taken per id.
    The shows returned are None where every id has 1, the clicks None where every id has 0: the defaults a
    PushRequest leaves out. Ids that are unique and increasing already (dense tables, a caller's np.unique) are
    taken as they are: no copy, no sort. InvalidArgumentError for a value a shard would refuse
    (ps.rows.pushcheck), or for grads of an id's occurrences that sum past float32's range, so that such a push
    is sent to no shard."""
    ids = np.ascontiguousarray(ids, dtype=np.uint64).ravel()
    grads = np.asarray(grads, dtype=np.float32).reshape(len(ids), dim)
    clicks = None if clicks is None else _per_id(clicks, len(ids), table, "clicks")
    if shows is not None:
        if wire.repeats_ids(ids):
            raise ValueError(f"push to {table!r} with shows given repeats ids; they must be unique")
        shows = _per_id(shows, len(ids), table, "shows")
        out = ids, grads, None if (shows == 1).all() else shows, clicks, None
    elif wire.strictly_increasing(ids):
        out = ids, grads, None, clicks, None
    else:
        counts = [np.ones((len(ids), 1), np.float32)] + ([] if clicks is None else [clicks.reshape(-1, 1)])
        uniq, summed = sum_duplicates(ids, np.concatenate([grads, *counts], axis=1))  # a show per occurrence
        order = np.searchsorted(uniq, ids)  # uniq is sorted: where each given id's row lands
        shows = None if len(uniq) == len(ids) else summed[:, dim]  # no duplicates: one show each
        out = uniq, summed[:, :dim], shows, None if clicks is None else summed[:, dim + 1], order
    if out[3] is not None and not out[3].any():  # no clicks (NaN counts as one: the check below names it)
        out = (*out[:3], None, out[4])
    try:
        check_push_values(table, *out[:4])  # as a shard checks it: a bad value reaches no shard
    except InvalidArgumentError:
        if out[4] is not None:  # summed: non-finite sums of finite grads are named as such
            _refuse_overflowed_sums(table, out[0], out[1], grads)
        raise
    return out


def _refuse_overflowed_sums(table: str, uniq: np.ndarray, summed: np.ndarray, grads: np.ndarray) -> None:
    """InvalidArgumentError where finite grads of one id's occurrences sum past float32's range (for a push that
    check_push_values refused: the one scan of the sums on the way that succeeds is its)."""
    bad = first_non_finite(summed)
    if bad >= 0 and first_non_finite(grads) < 0:
        bad //= summed.shape[1]
        raise InvalidArgumentError(
            f"grads for table {table!r}: the grads of id {int(uniq[bad])}'s occurrences, each finite, sum past "
            f"float32's range: {summed[bad].tolist()[:8]}; nothing was sent"
        )


def per_item(flags: bool | Sequence[bool], n: int) -> list[bool]:
    """One flag per item of n: a single flag for all of them, or a sequence of n (ValueError for another length)."""
    if isinstance(flags, (bool, np.bool_)):
        return [bool(flags)] * n
    out = [bool(f) for f in flags]
    if len(out) != n:
        raise ValueError(f"push_many has {len(out)} add_delta flags for {n} items")
    return out
