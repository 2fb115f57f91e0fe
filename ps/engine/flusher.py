"""Flusher: a shard's background flush thread, and the turn every flush of the shard takes (one at a time).

The thread calls the shard's flush(background=True) every flush_interval_s, or as soon as it is woken (the journal
has grown by journal_flush_bytes, or its segment was found deleted), and polls the data dir's disk in between. A
background flush waits, before each chunk it writes, for a moment without requests (Table.flush), unless urgent():
another flush waits for its turn, or the shard is closing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from ps.accel.threadnames import name_os_thread
from ps.errors import PsError, ShardNeedsRestartError
from ps.storage import diskspace
from ps.storage.diskspace import DiskWatch
from ps.storage.journal import Journal

log = logging.getLogger("ps.engine.shard")  # the shard's: its flusher is a part of it
FLUSH_FAILURE_LOG_S = 300.0  # between the log lines of a background flush that keeps failing


class Flusher:
    def __init__(
        self,
        flush: Callable[[bool], int],
        interval_s: float,
        journal: Journal,
        broken: Callable[[], str],
        data_dir: str,
    ):
        """flush(background): the shard's flush; broken(): why the shard takes no writes, or "" (nothing is
        flushed then: a flush would trim a journaled push RAM holds only part of). The thread starts at start()."""
        self._flush = flush
        self._interval_s = interval_s
        self._journal = journal
        self._broken = broken
        self._lock = threading.Lock()  # held by the flush that runs
        self._callers = 0  # flushes other than the thread's waiting for _lock or holding it
        self._callers_lock = threading.Lock()
        self._closed = threading.Event()
        self._wake = threading.Event()
        self.failures = 0  # background flushes failed in a row
        self._lost_flushed = False  # a flush since the journal segment was found deleted has succeeded
        self.disk_watch = DiskWatch(data_dir)  # polled by the thread: logs while the disk is low
        self._thread = threading.Thread(target=self._loop, name="ps-flusher", daemon=True)

    @contextlib.contextmanager
    def turn(self, background: bool) -> Iterator[None]:
        """Holds the flushes' lock; a caller other than the thread (background False) is counted meanwhile."""
        if background:
            with self._lock:
                yield
            return
        with self._callers_lock:
            self._callers += 1
        try:
            with self._lock:
                yield
        finally:
            with self._callers_lock:
                self._callers -= 1

    def urgent(self) -> bool:
        """The thread's chunks stop waiting for requests: another flush waits for its turn, or the shard closes."""
        return self._callers > 0 or self._closed.is_set()

    @property
    def flushing(self) -> bool:
        """Whether a flush runs now."""
        return self._lock.locked()

    def wake(self) -> None:
        """The thread flushes at once (or as soon as the flush it runs ends)."""
        self._wake.set()

    def start(self) -> None:
        """Polls the disk once (a shard starting on a disk already low says so at once), then starts the thread."""
        self.disk_watch.poll()
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stops the thread (a flush it runs ends first, urgent) and waits for it, timeout_s at most (None: until it
        ends); returns whether it ended."""
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        """Flushes every interval_s (or when woken). A failure keeps serving (the journal holds every
        acknowledged push) and is logged once, with its cause, then at most every FLUSH_FAILURE_LOG_S while it
        lasts; the flush that succeeds after says so. Every diskspace.CHECK_S, and before each flush,
        disk_watch.poll() (a warning while the disk runs low), whatever interval_s is."""
        name_os_thread()
        since, told = 0.0, 0.0
        next_flush = time.monotonic() + self._interval_s
        while not self._closed.is_set():
            disk_due = max(diskspace.CHECK_S, 1.0)  # at least a second: a CHECK_S of 0 must not spin
            woken = self._wake.wait(max(0.0, min(next_flush - time.monotonic(), disk_due)))
            if woken:  # cleared only when seen: a wake that comes after a timed-out wait is kept for the next one
                self._wake.clear()
            if self._closed.is_set():
                return
            if self._journal.dir_gone or self._broken():  # nothing written there can be kept, or a flush would
                continue  # trim a journaled push RAM holds only part of: the ERROR line said so
            self.disk_watch.poll()
            if not woken and time.monotonic() < next_flush:
                continue  # woke for the disk only
            lost = bool(self._journal.lost)  # before the flush's mark: no push is journaled after it then
            try:
                t0 = time.monotonic()
                rows = self._flush(True)
                if rows:  # an idle server's flushes write nothing, and say nothing
                    log.info("background flush: %s dirty rows written to RocksDB in %.1f s, the journal trimmed",
                             f"{rows:,}", time.monotonic() - t0)  # fmt: skip
            except ShardNeedsRestartError:  # it broke as this flush ran: the shard logged it, and flushes stop
                continue
            except Exception as e:  # keep serving: the journal still holds every acknowledged push
                self.failures += 1
                failures, now = self.failures, time.monotonic()
                if failures == 1:
                    since = told = now
                    known = isinstance(e, PsError)  # a full disk, damage: its message says it; anything else: a bug
                    log.error("background flush failed: %s; the journal keeps every acknowledged push; retrying "
                              "every %g s", e if known else f"{type(e).__name__}: {e}", self._interval_s,
                              exc_info=not known)  # fmt: skip
                elif now - told >= FLUSH_FAILURE_LOG_S:
                    told = now
                    log.error("background flush still failing after %.0f s (%s attempt%s): %s", now - since,
                              f"{failures:,}", "s" * (failures != 1), e)  # fmt: skip
                continue
            finally:  # the interval runs from the end of a flush: a slow one is not followed by another at once
                next_flush = time.monotonic() + self._interval_s
            if lost and not self._lost_flushed:
                self._lost_flushed = True
                log.warning("every push acknowledged before the journal segment was found deleted is in RocksDB now "
                            "(a kill loses none of them); this server still takes no writes: restart it")  # fmt: skip
            if self.failures:
                log.warning("background flush succeeded after %d failed attempts over %.0f s", self.failures,
                            time.monotonic() - since)  # fmt: skip
                self.failures = 0
