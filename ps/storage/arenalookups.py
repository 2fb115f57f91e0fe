"""ArenaLookups, Arena's base over ArenaEviction: the arena rows of a request's ids, read through the IdIndex:
looked up (touched and pinned), found (the index alone), or copied out (a pull's hits), split over the kernel
threads (ps.rows.parallel). The attributes declared on the class are set by Arena.__init__ (ps.storage.arena).
"""

from __future__ import annotations

import numba
import numpy as np

from ps.accel.prefetch import AHEAD, prefetch_row
from ps.hashing import mix64_scalar
from ps.rows.parallel import parts, run_each, run_parts
from ps.rows.update import touch
from ps.storage.eviction import ArenaEviction
from ps.storage.index import find, lookup_into, prefetch_slot


@numba.njit(nogil=True, cache=True)
def _group_by_home(ids, shift, k):
    """Positions of ids grouped by home slot modulo k: (positions, starts) with group g at
    positions[starts[g]:starts[g + 1]], in order of position within each group."""
    n = ids.shape[0]
    group = np.empty(n, np.int64)
    starts = np.zeros(k + 1, np.int64)
    for i in range(n):
        g = np.int64(mix64_scalar(ids[i]) >> shift) % k
        group[i] = g
        starts[g + 1] += 1
    for g in range(k):
        starts[g + 1] += starts[g]
    fill = starts[:k].copy()
    positions = np.empty(n, np.int64)
    for i in range(n):
        positions[fill[group[i]]] = i
        fill[group[i]] += 1
    return positions, starts


@numba.njit(nogil=True, cache=True)
def _lookup_touch(slots, shift, ids, positions, out, uses, pin, stamp):
    """For i in positions (in order): out[i] = row of ids[i] or -1; touches and pins hits. Returns
    the first position whose id repeats an earlier hit of this call (pin already == stamp), or -1."""
    dup = -1
    n = positions.shape[0]
    for p in range(n):
        if p + AHEAD < n:
            prefetch_slot(slots, shift, ids[positions[p + AHEAD]])
        i = positions[p]
        r = find(slots, shift, ids[i])
        out[i] = r
        if r >= 0:
            touch(uses, r)
            if pin[r] == stamp and dup < 0:
                dup = i
            pin[r] = stamp
    return dup


@numba.njit(nogil=True, cache=True)
def _lookup_gather(slots, shift, ids, data, cols, out, uses, rows):
    """The all-hits fast path of a pull: rows[i] = row of ids[i] (-1 if absent), out[i, :cols] = data[rows[i],
    :cols] and a touch for every id found; returns how many ids were not found (their out rows are left as they
    were).
    Two simple loops (look up all, then copy all) rather than one fused loop: more cache misses overlap. Parts
    run on several threads may touch one row at once: a use may go uncounted, the count never passes the cap."""
    n = ids.shape[0]
    lookup_into(slots, shift, ids, rows)
    misses = 0
    for i in range(n):
        if i + AHEAD < n and rows[i + AHEAD] >= 0:
            prefetch_row(data, rows[i + AHEAD])
        r = rows[i]
        if r < 0:
            misses += 1
            continue
        touch(uses, r)
        for j in range(cols):
            out[i, j] = data[r, j]
    return misses


@numba.njit(nogil=True, cache=True)
def _first_repeat(rows, seen):
    """First position whose row appeared earlier in rows, or -1; seen (one bit per arena row, all clear) is
    left clear. The bitmap is small enough to stay in cache (2M rows: 256 KB)."""
    n = rows.shape[0]
    first = -1
    marked = n
    for i in range(n):
        r = rows[i]
        word, bit = r >> 6, np.uint64(1) << np.uint64(r & 63)
        if seen[word] & bit:
            first, marked = i, i
            break
        seen[word] |= bit
    for k in range(marked):  # every set bit is in a word of rows[:marked]
        seen[rows[k] >> 6] = 0
    return first


class ArenaLookups(ArenaEviction):
    """The lookups of an arena's rows by id; a lookup pins the rows it finds and counts its ids for eviction."""

    data: np.ndarray  # float32 (capacity, line floats): the rows' lines
    ids: np.ndarray  # uint64 (capacity,): the id of each row
    capacity: int  # rows the arrays have room for
    _seen: np.ndarray | None  # first_repeat's bitmap, one bit per row, kept clear

    def lookup(self, ids: np.ndarray, stamp: int) -> tuple[np.ndarray, int]:
        """(row of each id or -1, index of the first repeated hit or -1); hits are touched and pinned."""
        out = np.empty(len(ids), dtype=np.int64)
        slots, shift = self.index.slots, self.index.shift
        k = len(parts(len(ids)))  # split by home slot, not by position: repeats of an id stay in one part
        if k == 1:
            positions, starts = np.arange(len(ids), dtype=np.int64), np.array([0, len(ids)])
        else:
            positions, starts = _group_by_home(ids, shift, k)
        dups = run_each(
            lambda g: _lookup_touch(
                slots, shift, ids, positions[starts[g] : starts[g + 1]], out, self.ref, self.pin, stamp
            ),
            k,
        )  # fmt: skip
        dups = [d for d in dups if d >= 0]
        self._count_lookup(stamp, len(ids))
        return out, min(dups) if dups else -1

    def pin_held(self, rows: np.ndarray, ids: np.ndarray, stamp: int) -> None:
        """Pins with stamp, as a lookup does, each row of rows (-1: none) that still holds its id of ids: a pull's
        hits, copied by gather_hits before the table lock was let go, wait for their push with the rows the pull
        admits. A row given back, freed or reused for another id since is left alone. No use is counted (the
        gather counted one); the ids count in the request's lookups (see ps.storage.eviction)."""
        hits = rows >= 0
        at = np.flatnonzero(hits & (rows < self.used))
        r = rows[at]
        held = (self.ids[r] == ids[at]) & (self.pin[r] >= 0)
        self.pin[r[held]] = stamp
        self._count_lookup(stamp, int(np.count_nonzero(hits)))  # every hit, held or not, as a lookup counts it

    def find_rows(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """(row of each id or -1, how many ids are absent), reading only the index: no row is touched, marked or
        pinned. With first_repeat, the push path's check for rows that are all in RAM (cheaper than lookup, which
        writes to each row's line)."""
        out = np.empty(len(ids), dtype=np.int64)
        slots, shift = self.index.slots, self.index.shift
        return out, sum(run_parts(lambda lo, hi: lookup_into(slots, shift, ids[lo:hi], out[lo:hi]), len(ids)))

    def first_repeat(self, rows: np.ndarray) -> int:
        """First position of rows (all >= 0) whose row appeared earlier in it, or -1."""
        if self._seen is None:  # allocated on the first push after each change of capacity
            self._seen = np.zeros((self.capacity + 63) // 64, dtype=np.uint64)
        return int(_first_repeat(rows, self._seen))

    def gather_hits(self, ids: np.ndarray, cols: int, out: np.ndarray, rows: np.ndarray | None = None) -> int:
        """Copies the first cols floats of every id present into out and touches its row; returns how many ids
        are absent. rows (int64, len(ids)), if given, gets the row of each id (-1 where absent)."""
        slots, shift = self.index.slots, self.index.shift
        rows = np.empty(len(ids), dtype=np.int64) if rows is None else rows
        return sum(run_parts(
            lambda lo, hi: _lookup_gather(slots, shift, ids[lo:hi], self.data, cols, out[lo:hi], self.ref,
                                          rows[lo:hi]),
            len(ids),
        ))  # fmt: skip
