"""The update kernel's packed inputs (Push, RowState, Target: compiled code reads their fields by name) and Outcome."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class Push(NamedTuple):
    ids: np.ndarray  # uint64 (n,)
    rows: np.ndarray  # int64 (n,): arena row of each id, unique
    grads: np.ndarray  # float32 (n, dim)
    shows: np.ndarray  # float32 (n,)
    clicks: np.ndarray  # float32 (n,)


class RowState(NamedTuple):
    data: np.ndarray  # float32 (capacity, line): each row's floats first
    lsn: np.ndarray  # uint64 (capacity,)
    dirty: np.ndarray  # uint8 (capacity,)
    stored: np.ndarray  # uint8 (capacity,): 0 not in RocksDB, 1 statistics only, 2 the full row
    ref: np.ndarray  # uint8 (capacity,): use count, 0..USE_CAP (see ps.rows.update.touch; ps.storage.eviction reads it)


class Target(NamedTuple):
    rows: np.ndarray  # float32 (n, width): undo copy (in place) or the updated rows (buffered)
    lsn: np.ndarray  # uint64 (n,) in place: each row's lsn before the push
    dirty: np.ndarray  # uint8 (n,) in place: each row's dirty flag before the push
    seq: np.uint64  # in place: the lsn the updated rows get
    in_place: bool


def in_place(n: int, width: int, seq: int) -> Target:
    """Target of a push of n rows applied to the arena itself at lsn seq, keeping what it overwrites for undo()."""
    rows = np.empty((n, width), np.float32)
    return Target(rows, np.empty(n, np.uint64), np.empty(n, np.uint8), np.uint64(seq), True)


def buffered(n: int, width: int) -> Target:
    """Target of a push of n rows computed into a new buffer (Target.rows) for commit(); the arena is untouched."""
    rows = np.empty((n, width), np.float32)
    return Target(rows, np.empty(0, np.uint64), np.empty(0, np.uint8), np.uint64(0), False)


@dataclass(frozen=True)
class Outcome:
    admitted: int  # ids admitted by this push
    d_admitted: int  # in place: change in the table's admitted ids (rows with a trained row)
    d_pending: int  # in place: change in its ids pushed but not admitted yet
    first_bad: int  # first position of the push whose row would not be finite, or -1
