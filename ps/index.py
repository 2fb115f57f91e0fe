"""IdIndex: a compiled open-addressing hash map from uint64 id to int64 arena row, for whole batches at once.

Linear probing over power-of-two arrays `keys` (uint64) and `vals` (int64, -1 = empty), so every uint64 id,
0 and 2**64-1 included, is a valid key. The probe start is the *high* bits of mix64(id): the low bits choose
the id's slot (ps.sharding), so within one shard they are far from uniform. Load stays <= 1/2; the map doubles
when an insert would pass that. Deletion shifts later entries of a probe run back (no tombstones).
"""

from __future__ import annotations

import numba
import numpy as np

from ps.sharding import mix64_scalar

MAX_LOAD = 0.5


@numba.njit(nogil=True, cache=True)
def _lookup(keys, vals, shift, ids, out):
    mask = keys.shape[0] - 1
    for i in range(ids.shape[0]):
        k = ids[i]
        h = np.int64(mix64_scalar(k) >> shift)
        out[i] = -1
        while vals[h] >= 0:
            if keys[h] == k:
                out[i] = vals[h]
                break
            h = (h + 1) & mask


@numba.njit(nogil=True, cache=True)
def _insert(keys, vals, shift, ids, rows):
    """Sets ids[i] -> rows[i]; returns how many ids were new."""
    mask = keys.shape[0] - 1
    added = 0
    for i in range(ids.shape[0]):
        k = ids[i]
        h = np.int64(mix64_scalar(k) >> shift)
        while vals[h] >= 0 and keys[h] != k:
            h = (h + 1) & mask
        if vals[h] < 0:
            added += 1
            keys[h] = k
        vals[h] = rows[i]
    return added


@numba.njit(nogil=True, cache=True)
def _delete(keys, vals, shift, ids):
    """Removes ids (absent ones are ignored) with backward-shift deletion; returns how many were removed."""
    mask = keys.shape[0] - 1
    removed = 0
    for n in range(ids.shape[0]):
        k = ids[n]
        i = np.int64(mix64_scalar(k) >> shift)
        while vals[i] >= 0 and keys[i] != k:
            i = (i + 1) & mask
        if vals[i] < 0:
            continue
        removed += 1
        j = i
        while True:  # pull later entries of the probe run back into the hole, unless that passes their home
            j = (j + 1) & mask
            if vals[j] < 0:
                break
            home = np.int64(mix64_scalar(keys[j]) >> shift)
            if i <= j:
                stays = i < home <= j
            else:
                stays = home > i or home <= j
            if not stays:
                keys[i] = keys[j]
                vals[i] = vals[j]
                i = j
        vals[i] = -1
    return removed


class IdIndex:
    """id -> row. Not thread-safe: the owning table serializes calls."""

    def __init__(self, capacity: int = 1024):
        bits = max(4, int(np.ceil(np.log2(max(capacity, 8) / MAX_LOAD))))
        self._alloc(bits)
        self.size = 0

    def _alloc(self, bits: int) -> None:
        self.bits = bits
        self.keys = np.zeros(1 << bits, dtype=np.uint64)
        self.vals = np.full(1 << bits, -1, dtype=np.int64)
        self.shift = np.uint64(64 - bits)

    def __len__(self) -> int:
        return self.size

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Row of each id, -1 where absent."""
        out = np.empty(len(ids), dtype=np.int64)
        _lookup(self.keys, self.vals, self.shift, np.ascontiguousarray(ids, dtype=np.uint64), out)
        return out

    def insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Maps ids[i] -> rows[i] (ids unique within the call); overwrites existing ids."""
        ids = np.ascontiguousarray(ids, dtype=np.uint64)
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if (self.size + len(ids)) > MAX_LOAD * len(self.keys):
            self._grow(self.size + len(ids))
        self.size += _insert(self.keys, self.vals, self.shift, ids, rows)

    def delete(self, ids: np.ndarray) -> None:
        """Removes ids; absent ids are ignored."""
        self.size -= _delete(self.keys, self.vals, self.shift, np.ascontiguousarray(ids, dtype=np.uint64))

    def _grow(self, need: int) -> None:
        used = self.vals >= 0
        old_keys, old_vals = self.keys[used], self.vals[used]
        bits = self.bits
        while need > MAX_LOAD * (1 << bits):
            bits += 1
        self._alloc(bits)
        _insert(self.keys, self.vals, self.shift, old_keys, old_vals)
