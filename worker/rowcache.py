"""RowCache: a worker's cache of table rows under one byte budget, each row stamped with the clock it is known
fresh at; when the budget is full the least frequently used rows leave first (CTR ids are Zipf-distributed: the
ids that keep coming back are the ones worth keeping).

A table's entries live in slots [0, capacity) of the rows and stamps kept here; an IdSlots per table
(worker/idslots.py) maps ids to those slots, counts each entry's uses and chooses the entries that leave
(evict_lfu, across tables). Every `decay_every` stores all frequencies are halved, so ids that were hot long ago
can leave.

Bytes of one entry (entry_bytes): its row (4 dim) and stamp (8), plus idslots.SLOT_BYTES of bookkeeping.
bytes_used counts the live entries so; a table's arrays grow by doubling, never past the entries capacity_bytes
allows, and after an eviction those of a table holding under half their slots shrink to its entries
(IdSlots.compact_if_sparse): the entries of one table that left for another's leave no arrays sized for the whole
budget behind, so the arrays of all tables (allocated_bytes) stay near the budget however many tables share it.
"""

from __future__ import annotations

import numba
import numpy as np

from worker.idslots import SATURATED, SLOT_BYTES, IdSlots, bucket_of, evict_lfu, grown


# numba caches this kernel by this file alone: an edit of idslots.bucket_of or SATURATED (compiled in as a
# constant) alone leaves its cached machine code as it was; clear the cache (__pycache__/*.nbi, *.nbc) after one
@numba.njit(nogil=True, cache=True)
def _lookup(buckets, shift, ids, freq, stamps, rows, min_stamp, out, hit):
    """out[i], hit[i] = the row of ids[i] if held with stamp >= min_stamp; touches the ids held; returns hits.
    All probes first, then the rows: independent loads the CPU overlaps."""
    n = ids.shape[0]
    slots = np.empty(n, np.int64)
    for i in range(n):
        slots[i] = np.int64(buckets[bucket_of(buckets, shift, ids[i]), 1]) - 1
    hits = 0
    for i in range(n):
        s = slots[i]
        if s >= 0:
            if freq[s] < SATURATED:
                freq[s] += 1
            if stamps[s] >= min_stamp:
                hit[i] = True
                hits += 1
                for j in range(rows.shape[1]):
                    out[i, j] = rows[s, j]
    return hits


@numba.njit(nogil=True, cache=True)
def _put(slots, src, stamp, rows, stamps):
    """rows[slots[i]] = src[i] and stamps[slots[i]] = stamp where slots[i] >= 0."""
    for i in range(slots.shape[0]):
        s = slots[i]
        if s >= 0:
            stamps[s] = stamp
            for j in range(rows.shape[1]):
                rows[s, j] = src[i, j]


class RowCache:
    """Rows of several tables under one byte budget (see the module docstring). Not thread-safe."""

    def __init__(self, capacity_bytes: int, dims: dict[str, int], decay_every: int = 64, seed: int = 0):
        """dims: {table: embedding dim}; decay_every: stores between halvings of every frequency."""
        self.capacity_bytes = int(capacity_bytes)
        self.dims = dict(dims)
        self.decay_every = max(1, decay_every)
        self.entry_bytes = {t: 4 * d + 8 + SLOT_BYTES for t, d in self.dims.items()}
        self._slots = {t: IdSlots(self.capacity_bytes // eb, seed + i) for i, (t, eb) in
                       enumerate(self.entry_bytes.items())}  # fmt: skip
        self._rows = {t: np.zeros((0, d), np.float32) for t, d in self.dims.items()}
        self._stamps = {t: np.zeros(0, np.int64) for t in self.dims}
        self.hits = self.misses = self.bytes_saved = self.stores = 0

    @property
    def hit_rate(self) -> float:
        """hits / (hits + misses); 0 before the first lookup."""
        looked = self.hits + self.misses
        return self.hits / looked if looked else 0.0

    @property
    def bytes_used(self) -> int:
        return sum(len(s) * self.entry_bytes[t] for t, s in self._slots.items())

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the arrays held for every table: rows, stamps and the IdSlots' (IdSlots.nbytes)."""
        return sum(self._rows[t].nbytes + self._stamps[t].nbytes + s.nbytes for t, s in self._slots.items())

    def __len__(self) -> int:
        return sum(len(s) for s in self._slots.values())

    def lookup(self, table: str, ids: np.ndarray, min_stamp: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows (n, dim) float32, hit (n,) bool) for ids (unique): a hit is an id held with stamp >= min_stamp;
        the rows of misses are zero. Every id held, fresh or not, counts one more use."""
        index = self._slots[table]
        ids = np.ascontiguousarray(ids, np.uint64).ravel()
        rows, hit = np.zeros((len(ids), self.dims[table]), np.float32), np.zeros(len(ids), np.bool_)
        n_hit = int(_lookup(index.buckets, index.shift, ids, index.freq, self._stamps[table], self._rows[table],
                            int(min_stamp), rows, hit))  # fmt: skip
        self.hits += n_hit
        self.misses += len(ids) - n_hit
        self.bytes_saved += n_hit * (4 * self.dims[table] + 8)
        return rows, hit

    def store(self, table: str, ids: np.ndarray, rows: np.ndarray, stamp: int) -> None:
        """Holds copies of rows (n, dim) for ids (unique; ValueError otherwise), fresh at `stamp`, replacing
        what was held. Past capacity_bytes the least frequently used entries of any table leave first (never the
        ids of this call that were held already); new ids that still do not fit are not stored."""
        ids = np.ascontiguousarray(ids, np.uint64).ravel()
        rows = np.ascontiguousarray(rows, np.float32).reshape(len(ids), self.dims[table])
        if len(ids) > 1 and not (ids[1:] > ids[:-1]).all() and len(np.unique(ids)) != len(ids):
            raise ValueError(f"RowCache.store to {table!r} repeats ids; they must be unique")
        index, eb = self._slots[table], self.entry_bytes[table]
        slots = index.find(ids)
        new = np.flatnonzero(slots < 0)
        need = self.bytes_used + len(new) * eb - self.capacity_bytes
        if need > 0:
            held = slots[slots >= 0]
            saved = index.pin(held)
            names = list(self._slots)
            evict_lfu([self._slots[t] for t in names], [self.entry_bytes[t] for t in names], need, self.stores)
            index.unpin(held, saved)
            new = new[: max(0, (self.capacity_bytes - self.bytes_used) // eb)]
        slots[new] = index.add(ids[new])
        self._rows[table] = grown(self._rows[table], index.capacity)
        self._stamps[table] = grown(self._stamps[table], index.capacity)
        _put(slots, rows, int(stamp), self._rows[table], self._stamps[table])
        self.stores += 1
        if self.stores % self.decay_every == 0:
            for s in self._slots.values():
                s.decay()
        if need > 0:
            self._compact()

    def _compact(self) -> None:
        """The arrays of every table that holds under half their slots shrunk to its entries (see the module
        docstring)."""
        for t, index in self._slots.items():
            self._rows[t], self._stamps[t] = index.compact_if_sparse(self._rows[t], self._stamps[t])

    def invalidate(self, table: str, ids: np.ndarray) -> None:
        """Forgets ids (absent ones are ignored)."""
        self._slots[table].remove(ids)

    def contents(self, table: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids sorted, rows, stamps) of every entry of table; counts nothing."""
        slots = self._slots[table].live_slots()
        keys = self._slots[table].keys[slots]
        order = np.argsort(keys)
        slots = slots[order]
        return keys[order], self._rows[table][slots], self._stamps[table][slots]
