"""IdSlots: ids mapped to the slots [0, capacity) of arrays their owner keeps (worker.rowcache's rows and stamps,
worker.geo's local rows), each slot with the id, a live flag and an access frequency (uint32, saturating), and
evict_lfu, which frees bytes across several of them:

    index     linear probing over a power-of-two array of (id, slot + 1) uint64 pairs (0: empty), probed from the
              high bits of mix64(id); load <= 1/2 (it doubles past that); a deletion shifts the later entries of
              its probe run back (no tombstones). Freed slots are reused before new ones.
    eviction  evict_lfu frees bytes across tables: a threshold T is read from the frequencies of randomly
              sampled entries at the fraction of entries to drop (1/64 at least), and a hand sweeping each
              table's slots (resumed where it stopped; the tables taken in turn) drops entries with frequency
              <= T until enough bytes are free; T moves up to the next frequency sampled (past the largest, it
              doubles) while a full sweep frees too little. The rows that leave are among the least frequent
              (LFU, up to the sampling), at a cost proportional to the slots swept. Pinned entries never leave.
    decay     IdSlots.decay halves every frequency, so ids that were hot long ago can leave; the owner says when.
    compact   IdSlots.compact_if_sparse moves the live entries to the first slots and shrinks the arrays and the
              index to fit them, where the arrays have more than twice the slots the entries take (and 64 more):
              the owner calls it after an eviction, so that a table whose entries left for another's does not keep
              arrays sized for the whole budget, and passes its own arrays of slots, which it moves as the entries.

SLOT_BYTES, the bookkeeping of one entry: id 8, frequency 4, live flag 1, free-list entry 8 and the index's worst
case, 64 (2-4 pairs of 16 B at load 1/2..1/4).
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from ps.hashing import mix64_scalar

SATURATED = np.uint32(0xFFFFFFFE)  # a frequency stops counting here
PINNED = np.uint32(0xFFFFFFFF)  # the frequency of a pinned entry: above every threshold, never evicted
SLOT_BYTES = 8 + 4 + 1 + 8 + 64  # per entry: id, frequency, live flag, free-list entry, index (see the docstring)
LIVE, HIGH, FREE, HAND, RNG = range(5)  # IdSlots.meta: live entries, high-water slot, free slots, hand, rng state
SAMPLES = 1024  # frequencies sampled to choose an eviction threshold


@numba.njit(inline="always")
def bucket_of(buckets: np.ndarray, shift: int, k: np.uint64) -> np.int64:
    """The bucket holding id k, or the empty bucket ending its probe run."""
    mask = buckets.shape[0] - 1
    h = np.int64(mix64_scalar(k) >> shift)
    while buckets[h, 1] != 0 and buckets[h, 0] != k:
        h = (h + 1) & mask
    return h


@numba.njit(inline="always")
def _unlink(buckets, shift, i):
    """Empties bucket i, shifting the later entries of its probe run back where their home allows."""
    mask = buckets.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        if buckets[j, 1] == 0:
            break
        home = np.int64(mix64_scalar(buckets[j, 0]) >> shift)
        stays = (i < home <= j) if i <= j else (home > i or home <= j)
        if not stays:
            buckets[i, 0] = buckets[j, 0]
            buckets[i, 1] = buckets[j, 1]
            i = j
    buckets[i, 1] = 0


@numba.njit(nogil=True, cache=True)
def _find(buckets, shift, ids, out):
    for i in range(ids.shape[0]):
        out[i] = np.int64(buckets[bucket_of(buckets, shift, ids[i]), 1]) - 1


@numba.njit(nogil=True, cache=True)
def _link(buckets, shift, ids, slots):
    for i in range(ids.shape[0]):
        h = bucket_of(buckets, shift, ids[i])
        buckets[h, 0] = ids[i]
        buckets[h, 1] = np.uint64(slots[i] + 1)


@numba.njit(nogil=True, cache=True)
def _add(buckets, shift, ids, keys, freq, live, free, meta, out):
    """Gives each id (absent, unique) a slot, freed ones first, with frequency 1."""
    for i in range(ids.shape[0]):
        if meta[FREE] > 0:
            meta[FREE] -= 1
            s = free[meta[FREE]]
        else:
            s = meta[HIGH]
            meta[HIGH] += 1
        keys[s], freq[s], live[s], out[i] = ids[i], 1, 1, s
        h = bucket_of(buckets, shift, ids[i])
        buckets[h, 0] = ids[i]
        buckets[h, 1] = np.uint64(s + 1)
    meta[LIVE] += ids.shape[0]


@numba.njit(inline="always")
def _drop(buckets, shift, keys, live, free, meta, s):
    _unlink(buckets, shift, bucket_of(buckets, shift, keys[s]))
    live[s] = 0
    free[meta[FREE]] = s
    meta[FREE] += 1
    meta[LIVE] -= 1


@numba.njit(nogil=True, cache=True)
def _remove(buckets, shift, ids, keys, live, free, meta):
    removed = 0
    for i in range(ids.shape[0]):
        v = buckets[bucket_of(buckets, shift, ids[i]), 1]
        if v != 0:
            _drop(buckets, shift, keys, live, free, meta, np.int64(v) - 1)
            removed += 1
    return removed


@numba.njit(nogil=True, cache=True)
def _sweep(buckets, shift, keys, freq, live, free, meta, threshold, want):
    """Drops up to `want` live entries with frequency <= threshold, from the hand on, at most one lap: the victims
    are chosen first (a sequential scan), then unlinked (independent probes the CPU overlaps)."""
    high, hand = meta[HIGH], meta[HAND]
    victims = np.empty(min(want, high), np.int64)
    chosen = 0
    for _ in range(high):
        if chosen >= victims.shape[0]:
            break
        if hand >= high:
            hand = 0
        if live[hand] and freq[hand] <= threshold:
            victims[chosen] = hand
            chosen += 1
        hand += 1
    meta[HAND] = hand
    for i in range(chosen):
        _drop(buckets, shift, keys, live, free, meta, victims[i])
    return chosen


@numba.njit(nogil=True, cache=True)
def _sample(freq, live, meta, out):
    """Fills out with the frequencies of random live entries (xorshift64 in meta[RNG]); returns how many."""
    high, got, x = meta[HIGH], 0, np.uint64(meta[RNG])
    if high == 0:
        return 0
    for _ in range(4 * out.shape[0]):
        x ^= x << np.uint64(13)
        x ^= x >> np.uint64(7)
        x ^= x << np.uint64(17)
        s = np.int64(x % np.uint64(high))
        if live[s]:
            out[got] = freq[s]
            got += 1
            if got == out.shape[0]:
                break
    meta[RNG] = np.int64(x)
    return got


@numba.njit(nogil=True, cache=True)
def _touch(freq, slots):
    for i in range(slots.shape[0]):
        s = slots[i]
        if s >= 0 and freq[s] < SATURATED:
            freq[s] += 1


def grown(a: np.ndarray, n: int) -> np.ndarray:
    """a with its first axis grown to n entries (the new ones zero); a itself when it has them."""
    if len(a) >= n:
        return a
    out = np.zeros((n, *a.shape[1:]), a.dtype)
    out[: len(a)] = a
    return out


class IdSlots:
    """id -> slot, with a frequency per slot and LFU eviction (see the module docstring). Not thread-safe."""

    def __init__(self, limit: int = 1 << 62, seed: int = 0):
        """limit: the slots the arrays grow to at most, unless more entries are live at once."""
        self.limit = max(1, limit)
        self.keys = np.zeros(0, np.uint64)
        self.freq = np.zeros(0, np.uint32)
        self.live = np.zeros(0, np.uint8)
        self.free = np.zeros(0, np.int64)
        self.meta = np.zeros(5, np.int64)
        self.meta[RNG] = (seed * 2654435761 + 0x9E3779B97F4A7C15) & 0x7FFFFFFFFFFFFFFF | 1
        self._index(10)

    def _index(self, bits: int) -> None:
        self.buckets = np.zeros((1 << bits, 2), np.uint64)
        self.shift = np.uint64(64 - bits)

    @property
    def capacity(self) -> int:
        """Slots the owner's arrays must have."""
        return len(self.keys)

    def __len__(self) -> int:
        return int(self.meta[LIVE])

    def find(self, ids: np.ndarray) -> np.ndarray:
        """int64 slot of each id, -1 where absent."""
        out = np.empty(len(ids), np.int64)
        _find(self.buckets, self.shift, np.ascontiguousarray(ids, np.uint64), out)
        return out

    def add(self, ids: np.ndarray) -> np.ndarray:
        """Slots for ids that are absent and unique (unchecked), with frequency 1; capacity may grow."""
        ids = np.ascontiguousarray(ids, np.uint64)
        live = len(self) + len(ids)
        if live > len(self.buckets) // 2:
            self._reindex(live)
        slots_needed = int(self.meta[HIGH]) + max(0, len(ids) - int(self.meta[FREE]))
        if slots_needed > self.capacity:
            n = max(slots_needed, min(2 * self.capacity, self.limit), 64)
            self.keys, self.freq = grown(self.keys, n), grown(self.freq, n)
            self.live, self.free = grown(self.live, n), grown(self.free, n)
        out = np.empty(len(ids), np.int64)
        _add(self.buckets, self.shift, ids, self.keys, self.freq, self.live, self.free, self.meta, out)
        return out

    def _reindex(self, live: int) -> None:
        bits = int(np.log2(len(self.buckets)))
        while live > (1 << bits) // 2:  # load <= 1/2
            bits += 1
        slots = self.live_slots()
        self._index(bits)
        _link(self.buckets, self.shift, self.keys[slots], slots)

    def remove(self, ids: np.ndarray) -> int:
        """Frees the slots of ids (absent ones ignored); returns how many were held."""
        ids = np.ascontiguousarray(ids, np.uint64)
        return int(_remove(self.buckets, self.shift, ids, self.keys, self.live, self.free, self.meta))

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held: ids, frequencies, live flags, free list and index."""
        return sum(a.nbytes for a in (self.keys, self.freq, self.live, self.free, self.buckets))

    def compact_if_sparse(self, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        """Where the arrays have more than 2 x live + 64 slots: the live entries moved to slots [0, live) in slot
        order, the arrays shrunk to max(live, 64) slots and the index to load <= 1/2 (at least 1024 buckets), the
        hand back at slot 0. Returns the owner's arrays (first axis: slots) moved the same way, as new arrays of
        capacity slots; elsewhere nothing moves and it returns them as they are."""
        live = len(self)
        if self.capacity <= 2 * live + 64:
            return arrays
        old = self.live_slots()
        n = max(live, 64)
        self.keys, self.freq = grown(self.keys[old], n), grown(self.freq[old], n)
        self.live, self.free = grown(self.live[old], n), np.zeros(n, np.int64)
        self.meta[LIVE], self.meta[HIGH], self.meta[FREE], self.meta[HAND] = live, live, 0, 0
        bits = 10
        while live > (1 << bits) // 2:  # load <= 1/2
            bits += 1
        self._index(bits)
        _link(self.buckets, self.shift, self.keys[:live], np.arange(live, dtype=np.int64))
        return tuple(grown(a[old], n) for a in arrays)

    def live_slots(self) -> np.ndarray:
        return np.flatnonzero(self.live[: self.meta[HIGH]]).astype(np.int64)

    def touch(self, slots: np.ndarray) -> None:
        """One more use of each slot (-1 entries skipped)."""
        _touch(self.freq, np.ascontiguousarray(slots, np.int64))

    def decay(self) -> None:
        high = int(self.meta[HIGH])
        self.freq[:high] >>= 1

    def pin(self, slots: np.ndarray) -> np.ndarray:
        """Keeps slots from eviction until unpin; returns their frequencies for unpin."""
        saved = self.freq[slots]
        self.freq[slots] = PINNED
        return saved

    def unpin(self, slots: np.ndarray, saved: np.ndarray) -> None:
        self.freq[slots] = saved

    def sample(self, n: int) -> np.ndarray:
        """Frequencies of up to n random live entries."""
        out = np.empty(n, np.uint32)
        return out[: _sample(self.freq, self.live, self.meta, out)]

    def sweep(self, threshold: int, want: int) -> int:
        """Drops up to want entries with frequency <= threshold (one lap of the hand at most); returns how many."""
        return int(_sweep(self.buckets, self.shift, self.keys, self.freq, self.live, self.free, self.meta,
                          np.uint32(min(threshold, SATURATED)), want))  # fmt: skip


def evict_lfu(sets: Sequence[IdSlots], entry_bytes: Sequence[int], need_bytes: int, start: int = 0) -> int:
    """Drops entries of the least frequency from sets (entry_bytes each) until need_bytes are free or only pinned
    entries remain; the sweep of sets starts at sets[start % len(sets)]. Returns the bytes freed."""
    live = np.array([len(s) for s in sets], np.int64)
    if need_bytes <= 0 or live.sum() == 0:
        return 0
    samples = np.concatenate([s.sample(max(1, SAMPLES * int(n) // int(live.sum()))) for s, n in zip(sets, live) if n])
    samples = samples[samples != PINNED]
    if len(samples) == 0:
        return 0
    mean_bytes = float(np.dot(live, entry_bytes)) / live.sum()
    quantile = min(1.0, max(need_bytes / mean_bytes / live.sum(), 1 / 64))
    samples.sort()
    threshold = int(samples[int(quantile * (len(samples) - 1))])
    freed, order = 0, [(start + i) % len(sets) for i in range(len(sets))]
    while True:
        for i in order:
            want = -(-(need_bytes - freed) // entry_bytes[i])
            freed += sets[i].sweep(threshold, want) * entry_bytes[i]
            if freed >= need_bytes:
                return freed
        if threshold >= SATURATED:
            return freed
        above = samples[samples > threshold]  # the next frequency sampled, else twice as far
        threshold = int(above[0]) if len(above) else min(2 * threshold + 1, int(SATURATED))
