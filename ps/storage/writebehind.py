"""WriteBehind: RocksDB writes of rows evicted from the RAM tier, done on one background thread, off the
request path that evicted them.

A batch is the arguments of one Store row write (table, ids, rows, lsn, complete, counts). From submit() until
RocksDB holds it, the batch is pending: a reader of RocksDB takes snapshot() of the pending batches before it
reads and lays them over what it read, newest last (Store.get_rows). A batch leaves the pending list only after
its write returned, so a batch missing from a snapshot was in RocksDB before the read that follows the snapshot.

Batches are written one at a time in submission order, so a later batch of the same id wins in RocksDB as in the
overlay. Pending bytes are bounded: submit() waits while they would exceed max_pending_bytes (a batch larger than
the bound waits for an empty queue; callers split theirs: rows_per_batch). A failed write stops the
thread; the batch stays pending (readers still see it) and every later submit() and drain() raises the error,
so nothing is reported written that is not. Writes that must land in order with pending ones (a flush's, a
shrink's) drain() first.

Given a Foreground, the thread waits before each write for a moment without requests (Foreground.wait_for_idle),
except while the write is urgent: a caller waits in submit() or drain(), the pending bytes are over half the bound,
or the writer is closing.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ps.accel.threadnames import name_os_thread
from ps.diskfull import DiskFullError
from ps.storage.foreground import Foreground


@dataclass(frozen=True)
class PendingBatch:
    """One row write: ids (n,) uint64, rows (n, width) float32, lsn (n,) uint64, complete (n,) bool, and the
    table's counts to record with them. sorted_ids and order (ids[order] == sorted_ids) serve lookups."""

    table: str
    ids: np.ndarray
    rows: np.ndarray
    lsn: np.ndarray
    complete: np.ndarray
    counts: dict
    order: np.ndarray = field(init=False)
    sorted_ids: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        order = np.argsort(self.ids, kind="stable")
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "sorted_ids", self.ids[order])

    @property
    def nbytes(self) -> int:
        """Bytes it holds: the rows with their ids, lsns and flags, and the lookup's order and sorted ids."""
        parts = (self.ids, self.rows, self.lsn, self.complete, self.order, self.sorted_ids)
        return sum(a.nbytes for a in parts)

    @staticmethod
    def row_bytes(width: int) -> int:
        """nbytes per row of a batch of `width`-float rows."""
        return 8 + 4 * width + 8 + 1 + 8 + 8

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit bool (len(ids),), the batch's index of each hit id)."""
        if len(self.sorted_ids) == 0:
            return np.zeros(len(ids), dtype=bool), np.zeros(0, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.sorted_ids, ids), len(self.sorted_ids) - 1)
        hit = self.sorted_ids[at] == ids
        return hit, self.order[at[hit]]


class WriteBehind:
    def __init__(self, write: Callable[[PendingBatch], None], max_pending_bytes: int,
                 foreground: Foreground | None = None, name: str = "ps-write-behind"):  # fmt: skip
        """write(batch) writes one batch to RocksDB (raising on failure); it runs on this object's thread.
        foreground: the requests its writes keep out of the way of (see the module)."""
        self._write = write
        self.max_pending_bytes = max_pending_bytes
        self._foreground = foreground
        self._waiting = 0  # callers waiting in submit() or drain()
        self._cv = threading.Condition()
        self._pending: deque[PendingBatch] = deque()  # submitted, not yet written; the head is being written
        self._pending_bytes = 0
        self._error: BaseException | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def rows_per_batch(self, width: int) -> int:
        """The most `width`-float rows one batch may hold for the pending bytes to stay within the bound (at least
        one)."""
        return max(1, self.max_pending_bytes // PendingBatch.row_bytes(width))

    def submit(self, batch: PendingBatch) -> None:
        """Queues batch for writing; waits while the pending bytes are over the bound. Raises the error of a
        failed earlier write (the batch is then not queued)."""
        with self._cv:
            while self._pending and self._pending_bytes + batch.nbytes > self.max_pending_bytes and not self._error:
                self._wait()
            self._raise_failure()
            if self._closing:
                raise RuntimeError("write-behind is closed")
            self._pending.append(batch)
            self._pending_bytes += batch.nbytes
            self._cv.notify_all()

    def snapshot(self, table: str) -> list[PendingBatch]:
        """The pending batches of table, oldest first."""
        with self._cv:
            return [b for b in self._pending if b.table == table]

    def drain(self) -> None:
        """Returns once every batch submitted before the call is in RocksDB; raises a failed write's error."""
        with self._cv:
            while self._pending and not self._error:
                self._wait()
            self._raise_failure()

    def _wait(self) -> None:
        """Waits on the condition (held) as a caller the writer must not keep waiting."""
        self._waiting += 1
        if self._foreground is not None:
            self._foreground.nudge()  # the thread may be waiting for a moment without requests: no longer
        try:
            self._cv.wait()
        finally:
            self._waiting -= 1

    def _urgent(self) -> bool:
        return bool(self._waiting) or self._closing or 2 * self._pending_bytes > self.max_pending_bytes

    def close(self) -> None:
        """Writes what is pending (unless a write failed), then stops the thread."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join()

    def _raise_failure(self) -> None:
        """Raises the failed background write's error (again): the rows it held stay pending in RAM, readable,
        and no later write goes on until a restart, which replays them from the journal. A full disk's error says
        so instead of "retry"."""
        if self._error is None:
            return
        e = self._error
        if isinstance(e, DiskFullError):
            raise e.instead("the background writer of evicted rows stopped there",
                            remedy="restart the server (its journal replays every acknowledged push)")  # fmt: skip
        raise e

    def _run(self) -> None:
        name_os_thread()
        while True:
            with self._cv:
                while not self._pending and not self._closing:
                    self._cv.wait()
                if not self._pending:
                    return
                batch = self._pending[0]
            if self._foreground is not None:
                self._foreground.wait_for_idle(urgent=self._urgent)
            try:
                self._write(batch)
            except BaseException as e:  # kept for the callers: the batch stays pending, readers still see it
                with self._cv:
                    self._error = e
                    self._cv.notify_all()
                return
            with self._cv:
                self._pending.popleft()
                self._pending_bytes -= batch.nbytes
                self._cv.notify_all()
