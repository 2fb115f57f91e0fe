"""IdQueue: a bounded FIFO of uint64 ids in one array, taken from the front and appended at the back in bulk.

The live entries are buf[head:tail]. take() moves the head; extend() drops what `keep` leaves no room for, then
writes at the tail; when the array has no room left there, it first moves the live entries to its start, into a
new array of 1.25x (plus 16) what they and the new ids need where the old one is too small or more than twice
that. So an append copies the queue about once per quarter of its length appended, not at every call: a copy of
the arena's probation queue of 10^6 ids (8 MB) per admitting request would cost a miss path pull of 11,000
misses (benchmarks/miss_path.py) about 3.5 ms more. The array never holds more than 2 x (1.25 m + 16) ids, m the
most entries kept plus appended at one extend()."""

from __future__ import annotations

import numpy as np

SPARE = 4  # a move leaves room for 1/SPARE of the entries it keeps (and the new ids) beyond them
MIN_ROOM = 16


class IdQueue:
    def __init__(self) -> None:
        self._buf = np.zeros(0, dtype=np.uint64)
        self._head = 0
        self._tail = 0

    def __len__(self) -> int:
        return self._tail - self._head

    @property
    def ids(self) -> np.ndarray:
        """The entries, front first: a view, valid (and writable in place) until the next extend()."""
        return self._buf[self._head : self._tail]

    def take(self, k: int) -> None:
        """Drops the k entries at the front."""
        if not 0 <= k <= len(self):
            raise ValueError(f"take({k}) from a queue of {len(self)}")
        self._head += k

    def extend(self, ids: np.ndarray, keep: int) -> None:
        """Appends ids at the back, then drops entries from the front until at most `keep` remain."""
        n = len(ids)
        if len(self) + n > keep:  # drop first: the dropped entries need not be moved
            self._head = min(self._tail, self._head + len(self) + n - keep)
        if self._tail + n > len(self._buf):
            live = self.ids
            room = len(live) + n
            size = room + room // SPARE + MIN_ROOM
            if len(self._buf) < room or len(self._buf) > 2 * size:  # too small, or far larger than needed
                buf = np.empty(size, dtype=np.uint64)
                buf[: len(live)] = live
                self._buf = buf
            else:
                self._buf[: len(live)] = live  # moves left: numpy copies overlapping ranges correctly
            self._head, self._tail = 0, len(live)
        self._buf[self._tail : self._tail + n] = ids
        self._tail += n
        if len(self) > keep:  # more new ids than keep
            self._head = self._tail - keep
