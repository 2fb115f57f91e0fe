"""IdQueue: a bounded FIFO of uint64 ids in one array, taken from the front and appended at the back in bulk.

The live entries are buf[head:tail]. take() moves the head; extend(ids, keep) drops what `keep` leaves no room
for, then writes at the tail. When the array has no room left there, the live entries move to its start: within
it where it has room for them and the new ids plus a quarter of that (plus 16), else into a new array of keep +
keep / 4 + 16. So an append copies the queue about once per quarter of its length appended, not at every call:
a copy of the arena's probation queue of 10^6 ids (8 MB, twice) per admitting request would cost a miss path
pull of 11,000 misses (benchmarks/miss_path.py) about 3.5 ms more. An array longer than keep + keep / 4 + 16 is
replaced at the next extend(), so after every extend() the array holds at most that many ids: 10 bytes per id it
may keep."""

from __future__ import annotations

import numpy as np

SPARE = 4  # a move leaves room for 1/SPARE of the entries it keeps and the new ids, beyond them
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
        """The entries, front first: a view, valid (and writable in place) until the next take() or extend()."""
        return self._buf[self._head : self._tail]

    def take(self, k: int) -> None:
        """Drops the k entries at the front."""
        if not 0 <= k <= len(self):
            raise ValueError(f"take({k}) from a queue of {len(self)}")
        self._head += k

    def extend(self, ids: np.ndarray, keep: int) -> None:
        """Appends ids (not a view of this queue's own array) at the back, then drops entries from the front until
        at most `keep` remain."""
        if len(ids) >= keep:  # only the newest `keep` of them stay
            ids, self._head = ids[len(ids) - keep :], self._tail
        elif len(self) + len(ids) > keep:  # dropped first: they need not be moved
            self._head = self._tail - (keep - len(ids))
        n, limit = len(ids), keep + keep // SPARE + MIN_ROOM
        if self._tail + n > len(self._buf) or len(self._buf) > limit:
            live = self.ids
            room = len(live) + n
            if len(self._buf) > limit or len(self._buf) < room + room // SPARE + MIN_ROOM:
                buf = np.empty(limit, dtype=np.uint64)
                buf[: len(live)] = live
                self._buf = buf
            else:
                self._buf[: len(live)] = live  # moves left: numpy copies overlapping ranges correctly
            self._head, self._tail = 0, len(live)
        self._buf[self._tail : self._tail + n] = ids
        self._tail += n
