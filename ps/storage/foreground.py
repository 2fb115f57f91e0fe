"""Foreground: the requests in progress on a shard, so that its background writers keep out of their way.

A background RocksDB write (the write-behind's batch of evicted rows, a chunk of the flusher's) holds Python's lock
for its whole call: rocksdict's write does not release it. A request that runs meanwhile stalls at every point
where it gives that lock up and takes it back (a compiled kernel, a numpy call, a reader thread's RocksDB read):
in benchmarks/miss_path.py's Zipf runs, a pull that admitted its misses beside the write of its 11,000 evicted rows
(about 12 ms) took 7.7 ms to admit them, against about 2 without it. So a background writer calls wait_for_idle()
before each write: it waits until no request is in progress (serving()), for at most
limit_s, and no longer once its work is urgent (a caller blocked on it). The writes then land between requests,
and under a load that leaves no moment between requests, each waits out its limit and goes on. A request is a
pull's or a push's work on the shard's tables and, in ps.service, the whole RPC around it (its decoding aside):
the moment between two tables' parts of one PullBatch is no moment to start a write in.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

YIELD_LIMIT_S = 0.05  # the longest a background write waits for a moment without requests
POLL_S = 0.005  # how often a waiting writer checks whether its work became urgent


class Foreground:
    def __init__(self, limit_s: float = YIELD_LIMIT_S) -> None:
        """limit_s: the longest wait_for_idle() waits."""
        self.limit_s = limit_s
        self._cv = threading.Condition()
        self._active = 0  # requests in serving()

    @property
    def active(self) -> int:
        return self._active

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Marks a request in progress for the duration of the block."""
        with self._cv:
            self._active += 1
        try:
            yield
        finally:
            with self._cv:
                self._active -= 1
                if self._active == 0:
                    self._cv.notify_all()

    def nudge(self) -> None:
        """Has wait_for_idle() check urgent() now: call it when that may have become true."""
        with self._cv:
            self._cv.notify_all()

    def wait_for_idle(self, urgent: Callable[[], bool] = lambda: False) -> bool:
        """Waits until no request is in progress, limit_s passes, or urgent() is true (checked every POLL_S, and
        at each nudge()). Returns whether it found no request in progress."""
        deadline = time.monotonic() + self.limit_s
        with self._cv:
            while self._active:
                left = deadline - time.monotonic()
                if left <= 0 or urgent():
                    return False
                self._cv.wait(min(left, POLL_S))
            return True
