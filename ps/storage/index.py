"""IdIndex: a compiled open-addressing hash map from uint64 id to arena row, for whole batches at once.

Linear probing over one power-of-two array `slots` of (key, row + 1) uint64 pairs, so a probe touches one cache
line; row + 1 == 0 marks an empty slot, so every uint64 id (0 and 2**64-1 included) is a valid key. The probe
starts at the *high* bits of mix64(id): the low bits choose the id's slot (ps.sharding), so within one shard
they are far from uniform. Load stays <= 1/2; the map doubles when an insert would pass that. Deletion shifts
later entries of a probe run back (no tombstones).

Resizing is in place: the array is resized (its pages move to the larger mapping where the OS can,
ps.accel.hugepages.resize) and its entries are moved to their slots in the new size within it (_rehash), so a
doubling holds the new array and nothing else: at most 4 slots per entry, 64 bytes, what the RAM tier charges a row
for its index (ps.rows.layout.INDEX_BYTES_PER_ROW), with no copy of the entries beside it. A shrink lays the entries
out in the smaller size first, then resizes.
"""

from __future__ import annotations

import numba
import numpy as np

from ps.accel import hugepages
from ps.accel.prefetch import AHEAD, prefetch_row
from ps.hashing import mix64_scalar

MAX_LOAD = 0.5
UNPLACED = np.uint64(1 << 63)  # set in a slot's row + 1 while _rehash has not yet moved its entry (rows are < 2**63)


@numba.njit(inline="always")
def find(slots: np.ndarray, shift: np.uint64, k: np.uint64) -> np.int64:
    """Row of key k, or -1."""
    mask = slots.shape[0] - 1
    h = np.int64(mix64_scalar(k) >> shift)
    while True:
        v = slots[h, 1]
        if v == 0:
            return np.int64(-1)
        if slots[h, 0] == k:
            return np.int64(v) - 1
        h = (h + 1) & mask


@numba.njit(inline="always")
def _slot_of(slots: np.ndarray, shift: np.uint64, k: np.uint64) -> np.int64:
    """The slot that holds key k, or the empty slot that ends its probe run (where k would go)."""
    mask = slots.shape[0] - 1
    h = np.int64(mix64_scalar(k) >> shift)
    while slots[h, 1] != 0 and slots[h, 0] != k:
        h = (h + 1) & mask
    return h


@numba.njit(inline="always")
def prefetch_slot(slots: np.ndarray, shift: np.uint64, k: np.uint64) -> None:
    """Asks the cache for the home slot of key k (see ps.accel.prefetch)."""
    prefetch_row(slots, np.int64(mix64_scalar(k) >> shift))


@numba.njit(nogil=True, cache=True)
def lookup_into(slots: np.ndarray, shift: np.uint64, ids: np.ndarray, out: np.ndarray) -> int:
    """out[i] = row of ids[i] or -1; returns how many were not found."""
    n = ids.shape[0]
    misses = 0
    for i in range(n):
        if i + AHEAD < n:
            prefetch_slot(slots, shift, ids[i + AHEAD])
        r = find(slots, shift, ids[i])
        out[i] = r
        misses += r < 0
    return misses


@numba.njit(nogil=True, cache=True)
def _insert(slots, shift, ids, rows):
    """Sets ids[i] -> rows[i]; returns how many ids were new."""
    added = 0
    for i in range(ids.shape[0]):
        k = ids[i]
        h = _slot_of(slots, shift, k)
        if slots[h, 1] == 0:
            added += 1
            slots[h, 0] = k
        slots[h, 1] = np.uint64(rows[i] + 1)
    return added


@numba.njit(nogil=True, cache=True)
def _delete(slots, shift, ids):
    """Removes ids (absent ones are ignored) with backward-shift deletion; returns how many were removed."""
    mask = slots.shape[0] - 1
    removed = 0
    for n in range(ids.shape[0]):
        i = _slot_of(slots, shift, ids[n])
        if slots[i, 1] == 0:
            continue
        removed += 1
        j = i
        while True:  # pull later entries of the probe run back into the hole, unless that passes their home
            j = (j + 1) & mask
            if slots[j, 1] == 0:
                break
            home = np.int64(mix64_scalar(slots[j, 0]) >> shift)
            if i <= j:
                stays = i < home <= j
            else:
                stays = home > i or home <= j
            if not stays:
                slots[i, 0] = slots[j, 0]
                slots[i, 1] = slots[j, 1]
                i = j
        slots[i, 1] = 0
    return removed


@numba.njit(nogil=True, cache=True)
def _rehash(slots, shift, old_n, new_n):
    """Moves the entries of a table of old_n slots, slots[:old_n], to where a table of new_n slots (probes from
    `shift`) puts them, slots[:new_n], in place; slots has room for both, and slots[old_n:new_n] is empty. Each
    entry is marked UNPLACED, then taken out in slot order and inserted, taking the place of the first empty or
    UNPLACED slot of its probe (the entry found there is inserted next). A placed entry stays where it is, and its
    probe passed only placed entries, so every probe run is whole at the end; slots[new_n:] is left empty."""
    mask = new_n - 1
    for i in range(old_n):
        if slots[i, 1] != 0:
            slots[i, 1] |= UNPLACED
    for i in range(old_n):
        while slots[i, 1] & UNPLACED:
            k = slots[i, 0]
            v = slots[i, 1] ^ UNPLACED
            slots[i, 1] = 0
            h = np.int64(mix64_scalar(k) >> shift)
            while True:
                w = slots[h, 1]
                if w != 0 and not (w & UNPLACED):
                    h = (h + 1) & mask
                    continue
                displaced = slots[h, 0]
                slots[h, 0] = k
                slots[h, 1] = v
                if w == 0:
                    break
                k, v = displaced, w ^ UNPLACED
                h = np.int64(mix64_scalar(k) >> shift)


class IdIndex:
    """id -> row. Not thread-safe: the owning table serializes calls."""

    def __init__(self, capacity: int = 1024):
        bits = max(4, int(np.ceil(np.log2(max(capacity, 8) / MAX_LOAD))))
        self._alloc(bits)
        self.size = 0

    def _alloc(self, bits: int) -> None:
        self.bits = bits
        self.slots = hugepages.zeros((1 << bits, 2), np.uint64)
        self.shift = np.uint64(64 - bits)

    def __len__(self) -> int:
        return self.size

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Row of each id, -1 where absent."""
        out = np.empty(len(ids), dtype=np.int64)
        lookup_into(self.slots, self.shift, np.ascontiguousarray(ids, dtype=np.uint64), out)
        return out

    def insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Maps ids[i] -> rows[i] (ids unique within the call); overwrites existing ids."""
        ids = np.ascontiguousarray(ids, dtype=np.uint64)
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if (self.size + len(ids)) > MAX_LOAD * len(self.slots):
            self._grow(self.size + len(ids))
        self.size += _insert(self.slots, self.shift, ids, rows)

    def delete(self, ids: np.ndarray) -> None:
        """Removes ids; absent ids are ignored."""
        self.size -= _delete(self.slots, self.shift, np.ascontiguousarray(ids, dtype=np.uint64))

    def shrink(self, max_bytes: int) -> None:
        """Lays the table out at the size its entries need (under 4 slots of 16 bytes each) where it takes more
        than max_bytes now and that is smaller: an arena that gave rows back keeps its index within the charge of
        the rows it still pays for (ps.rows.layout.INDEX_BYTES_PER_ROW each), and a change that leaves it within
        that does not resize it. Where the array cannot be resized (no memory for a copy), the table is laid out at its
        size again and the error propagates."""
        bits = max(4, int(np.ceil(np.log2(max(self.size, 8) / MAX_LOAD))))
        if self.slots.nbytes > max_bytes and bits < self.bits:
            old_bits = self.bits
            self._rehash(bits)
            try:
                hugepages.resize(self, "slots", 1 << bits)
            except BaseException:  # the array keeps its size: so does the table (find probes the whole array)
                self._rehash(old_bits)
                raise

    def _grow(self, need: int) -> None:
        bits = self.bits
        while need > MAX_LOAD * (1 << bits):
            bits += 1
        hugepages.resize(self, "slots", 1 << bits)  # the entries stay in the first slots, empty ones follow
        self._rehash(bits)

    def _rehash(self, bits: int) -> None:
        """Lays the entries out for a table of 2**bits slots, in place (_rehash): the array has room for it."""
        old_n = 1 << self.bits
        self.bits, self.shift = bits, np.uint64(64 - bits)
        _rehash(self.slots, self.shift, old_n, 1 << bits)
