"""Prefaulter: keeps the bytes just past an appended file's end allocated and in the page cache, from a background
thread, so that appends overwrite prepared pages instead of allocating new ones.

Optional: correctness never depends on it. Where Linux fallocate(2) is missing, or the file system refuses it
(EOPNOTSUPP), or it fails (a full disk), the Prefaulter stops preparing and the journal's appends allocate their
space as they go, written with pwritev: the same bytes in the file. Where MADV_POPULATE_WRITE fails (a kernel
without it), it prepares the space without populating the writer's mapping, mapped_end stops growing, and the
journal writes with pwritev into the prepared space. What correctness needs of it: it never writes a byte of the
file (fallocate allocates without writing, then a read brings the pages into the cache, and populating maps
them), so a record being appended is never overwritten; and a reader of the file takes a run of zero bytes after
the last record as unused space, because prepared space reads as zeros until it is written (ps.storage.journalreplay
does; ps.storage.journal truncates the file to its real end when it closes it).

Why: an append into new file space makes the kernel allocate, zero and account a page-cache page per 4 KB (and
the file system reserve blocks) inside the write call, on the push's path; the Prefaulter does that work ahead, on a
core that is otherwise waiting. Given the writer's mapping of the file (ps.accel.filemap), it also populates the
mapping's page tables for writing, so the writer's copies into it take no page faults; the pages it populates
become dirty zero pages, which the kernel may write to disk before records overwrite them.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import threading

import numpy as np

from ps.accel.filemap import FileMap
from ps.accel.threadnames import name_os_thread

log = logging.getLogger(__name__)


def _kernel_fallocate():
    """Linux fallocate(2) itself, or None. Not os.posix_fallocate: where the file system lacks fallocate, glibc
    emulates it by writing a zero into every block whose byte reads as zero, and such a write can land on a
    record the journal is writing at that moment and zero it (`strace -e inject=fallocate:error=EOPNOTSUPP`
    shows it). The kernel call allocates without writing, or fails."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    fn.restype = ctypes.c_int

    def fallocate(fd: int, offset: int, length: int) -> None:
        if fn(fd, 0, offset, length) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"fallocate: {os.strerror(e)}")

    return fallocate


_fallocate = _kernel_fallocate()

CHUNK_BYTES = 2 << 20  # prepared per step; detach() waits for at most one step
MIN_AHEAD_BYTES = 8 << 20  # keep at least this much prepared past the end ...
AHEAD_RECORDS = 4  # ... and room for this many of the largest records appended so far


class Prefaulter:
    """Prepares [end, end + ahead) of one attached file at a time, capped at the limit given to attach().
    attach / detach are called by the writer under its own lock; appended() never blocks. The thread starts on
    the first attach."""

    def __init__(self):
        self._lock = threading.Lock()  # held while a step works on the attached fd, and by attach / detach
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._fd = -1
        self._map: FileMap | None = None
        self._limit = 0
        self._done = 0  # [0, _done) of the attached file is prepared (or written)
        self._mapped = 0  # [0, _mapped) of it is also populated in the filemap (see mapped_end)
        self._end = 0  # the writer's end, as appended() last said: nothing below it needs preparing
        self._want = 0
        self._largest = 0
        self._disabled = _fallocate is None  # no fallocate (or the file system refused it): appends allocate as they go
        self._buf = np.empty(CHUNK_BYTES, dtype=np.uint8)

    def attach(self, fd: int, limit: int, filemap: FileMap | None = None) -> None:
        """From now on prepare fd, whose current size is its end, up to at most limit bytes; with filemap (a
        mapping of fd), populate its page tables for writing too."""
        with self._lock:
            self._fd, self._limit, self._map = fd, limit, filemap
            self._done = self._want = self._end = self._mapped = os.fstat(fd).st_size
            if self._thread is None and not self._disabled:
                self._thread = threading.Thread(target=self._run, name="journal-prefault", daemon=True)
                self._thread.start()

    def detach(self) -> None:
        """Stops preparing the attached file (waits for a step in progress): the writer may truncate or close it,
        or unmap its filemap."""
        with self._lock:
            self._fd = -1
            self._map = None

    @property
    def mapped_end(self) -> int:
        """[0, mapped_end) of the attached file is prepared and populated in its filemap, or was there when the
        filemap was attached: the writer may copy into it (0 without a filemap, or once populating failed)."""
        return self._mapped if self._fd >= 0 and self._map is not None else 0

    def appended(self, end: int, record_bytes: int) -> None:
        """The attached file's end is now `end`, after a record of record_bytes: prepare ahead of it."""
        self._end = end
        self._largest = max(self._largest, record_bytes)
        want = min(self._limit, end + max(MIN_AHEAD_BYTES, AHEAD_RECORDS * self._largest))
        if want > self._done and not self._disabled:
            self._want = want
            self._wake.set()

    def close(self) -> None:
        self.detach()
        self._stopped = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        name_os_thread()
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopped:
                return
            while self._step():
                pass

    def _step(self) -> bool:
        """Prepares the next chunk of the attached file; False when there is nothing (more) to do."""
        with self._lock:
            lo = max(self._done, self._end)
            if self._fd < 0 or self._stopped or lo >= self._want:
                return False
            hi = min(self._want, lo + CHUNK_BYTES)
            try:
                _fallocate(self._fd, lo, hi - lo)  # allocates blocks, writes nothing: written bytes stay as they are
                if self._map is not None and self._map.populate(lo, hi):  # (below lo: records, or populated)
                    self._mapped = hi  # mapped in, writable: the writer's copies take no page faults
                else:  # no mapping, or populating has failed (the writer copies no further): cache the pages
                    os.preadv(self._fd, [memoryview(self._buf)[: hi - lo]], lo)
            except OSError as e:  # e.g. EOPNOTSUPP (no fallocate on this file system), or the disk is full
                level = logging.INFO if e.errno == errno.EOPNOTSUPP else logging.WARNING
                log.log(level, "journal: cannot prepare space ahead of appends (%s); appends allocate as they go", e)
                self._disabled = True
                self._fd = -1
                return False
            self._done = hi
            return True
