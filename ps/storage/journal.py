"""Journal: the push log that makes a push durable before it is acknowledged, replayed at start-up.

Files: the segments in <data_dir>/journal/, one active at a time, a new one started when it reaches
segment_bytes; trim(seq) deletes the segments whose records are all <= seq (their effects are in RocksDB).

Record format (its grammar, the one place it is written): ps.storage.journalformat. Replay (the replay rule,
the checks against the mark and RocksDB's rows): ps.storage.journalreplay.

Writing: a record is written with one pwritev; or, where ps.accel.prefault has prepared the space and
ps.accel.filemap has mapped the segment, it is copied into the mapping: the header with a zero checksum, then
the payload copied and checksummed in one pass (copy_with_checksum64), then the checksum. Both ways leave the
same bytes in the file; the mapped copy is optional and never used with sync. With sync=True every append is
fsynced before it returns (it survives power loss, not only a crash of the process). A failed append is cut off
before the error is raised, so the file ends with the last acknowledged record, and takes no seq: the next append
writes the same seq at the same offset. A short pwritev (a disk that filled up part-way) is written on once, to
complete the record or to get the real error; a full disk (ENOSPC, EDQUOT) is a ps.diskfull.DiskFullError naming
the journal's directory.

The mark: a journal given a mark_path keeps there, in a file outside the journal's directory
(ps.storage.sidefiles), the seq of the last record written: written when replay first opens the journal of a
data dir (0 before any record), or finds the mark missing or damaged (a loss accepted), then at each rotation
and at most a second behind the appends (a background thread; nothing on the append path). Replay requires every record
up to the mark and up to the largest lsn of a row RocksDB holds (rows_seq), and appends go on past both
(ps.storage.journalreplay says what it refuses).

Deleted under the running server: the mark's thread also checks, each time it wakes (check_intact, about once a
second), that the active segment is still linked and that the data dir (the mark's directory) is the one the
journal started in (ps.storage.journalwatch). Once either is found, `lost` says what happened, every later append
raises ps.errors.DataDirLostError (nothing appended), on_lost is told, and the mark is no longer written into a
data dir that is gone. Appends only read `lost`: no syscall is added to them, so a push that comes between the
deletion and the next check (at most about a second) is still acknowledged.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import struct
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from ps.accel.filemap import FileMap
from ps.accel.prefault import Prefaulter
from ps.diskfull import DiskFullError, disk_full_reason
from ps.errors import NOTHING_APPLIED, DataDirLostError, FileTooLargeError, StorageError
from ps.storage.applied import AppliedChanges, AppliedTable
from ps.storage.atomicfile import sync_directory
from ps.storage.checksum import checksum64, copy_with_checksum64
from ps.storage.journalformat import (
    HEADER,
    HEADER_CHECKED,
    MAGIC,
    NO_ORIGIN,
    Origin,
    Record,
    list_segments,
    payload_head,
    segment_path,
)
from ps.storage.journalreplay import JournalReader
from ps.storage.journalwatch import DataDirWatch
from ps.storage.sidefiles import MarkWriter

log = logging.getLogger(__name__)

RELEASE_BYTES = 32 << 20  # appended records leave the process's RSS this many bytes at a time


class Journal:
    """The push journal in `directory`. Replay it before the first append; appends, trim, mark and
    size_bytes may come from several threads (they take the journal's lock). mark_path: where to keep the mark
    (see the module's docstring; None: no mark), from replay() on."""

    def __init__(self, directory: str, sync: bool = False, segment_bytes: int = 256 << 20,
                 mark_path: str | None = None):  # fmt: skip
        self.dir = directory
        self.mark_path = mark_path
        self._marker: MarkWriter | None = None  # started by replay()
        self.sync = sync
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._fd = -1
        self._path = ""  # the active segment
        self._segment_size = 0  # bytes of records in it: the next append's offset (the file may be longer)
        self._prefault = Prefaulter()
        self._map: FileMap | None = None  # the active segment, mapped: appends into prepared space are copies
        self._released = 0  # [0, _released) of _map is released (ps.accel.filemap)
        self.mapped_appends = 0  # appends written through _map (the others: pwritev)
        self._failed = ""  # why appends are refused (a failed append that could not be cut off), or ""
        self.lost = ""  # what was deleted under the running server (check_intact), or "": appends are refused
        self.dir_gone = False  # the data dir itself was deleted or replaced (not only the segment)
        self.on_lost: Callable[[], None] | None = None  # told once, from the mark's thread, when `lost` is set
        self._watch = DataDirWatch(os.path.dirname(mark_path) if mark_path else "")  # started by replay()
        self._opened_at = 0.0  # time.time() when the active segment was opened
        self.next_seq = 1
        self.bytes_written = 0
        self.applied = AppliedTable()  # client -> (client_seq, parts done) of its newest request, and its digest
        self._reader = JournalReader(directory, mark_path, sync, self.note_applied)  # replay's and check's reads

    @property
    def losses(self) -> list[str]:
        """What replay went on without (accept_loss)."""
        return self._reader.losses

    @property
    def replay_bytes(self) -> tuple[int, int]:
        """(read, to read) of the segments' bytes, as a replay goes: its progress."""
        return self._reader.progress

    @property
    def mapped_bytes(self) -> int:
        """The size of the segment mapped for appends now (the most of the mapping that can be resident), or 0."""
        return self.segment_bytes if self._map is not None else 0

    def note_applied(self, origin: Origin) -> None:
        """Records that push `part` of request (client, client_seq), of content `digest` (0: unknown), is applied
        (newest wins; 0 client: none)."""
        client, client_seq, part, digest = origin
        if client:
            self.applied.note(client, client_seq, part, digest)

    def mark(self) -> tuple[int, AppliedChanges]:
        """Closes the active segment; returns (the last seq appended, `applied`'s changes since the last mark:
        AppliedTable.take_changes under the lock that appends note under, so they cover every record up to that seq
        and none after it)."""
        with self._lock:
            self._close_fd()
            out = self.next_seq - 1, self.applied.take_changes()
        self._write_mark()
        return out

    def _write_mark(self) -> None:
        if self._marker is not None and not self.dir_gone:
            self._marker.write()

    # ---- segments -------------------------------------------------------------------------------------
    def segments(self) -> list[tuple[int, str]]:
        """(first seq, path) of every segment, oldest first (ps.storage.journalformat.list_segments)."""
        return list_segments(self.dir)

    def replay(self, after_seq: int, accept_loss: bool = False, rows_seq: int = 0) -> Iterator[Record]:
        """Yields the intact records with seq > after_seq (the last one RocksDB holds), in order; afterwards
        appends continue past them, past the mark and past rows_seq, and the mark is kept from now on. rows_seq:
        the largest lsn of a row RocksDB holds (ps.storage.shardmeta.ShardMeta.written_seq): that record was
        written, as every one before it, like those up to the mark (a row written back before a flush can hold a
        push the mark does not cover yet); a new push must get a seq above it, or a later replay would skip it on
        that row.

        A bad record that the replay rule (ps.storage.journalreplay) takes for the torn end of a crash is cut off,
        with the zeros after it. Any other bad record raises JournalCorruptError, and a record missing up to the
        mark or rows_seq raises JournalLossError, before anything is cut; with accept_loss, each is a warning (kept
        in `losses`)."""
        end = yield from self._reader.read(after_seq, accept_loss, rows_seq)
        self._reader.cut_tail(end)
        self.next_seq = max(end.last, end.written) + 1
        if self.mark_path is not None:
            self._watch.start()
            kept = end.mark_read  # else a new data dir, or a mark missing or damaged (a loss accepted): marked now
            self._marker = MarkWriter(self.mark_path, lambda: self.next_seq - 1, end.mark if kept else -1,
                                      sync_dir=self.sync, check=self.check_intact)  # fmt: skip
            if not kept:
                self._marker.write()

    def seems_lost(self) -> bool:
        """Whether the journal found its data dir or active segment gone (`lost`), or its next check_intact would:
        the same two syscalls, with no lock taken and nothing changed, for a signal handler (the thread it
        interrupts may hold the lock). A segment closed meanwhile reads as intact."""
        return bool(self.lost) or self._watch.dir_gone() or self._watch.segment_gone(self._fd)

    def check_intact(self) -> bool:
        """Whether the data dir is still the one the journal started in (see the module's docstring); on the first
        check that finds it gone or replaced, or the active segment deleted, sets `lost` (appends are refused from
        then on), logs one ERROR line saying what happened and calls on_lost. Returns False while the data dir is
        gone (the mark cannot be written there), True otherwise. Called by the mark's thread, about once a second;
        two syscalls (os.stat, os.fstat), none on the append path."""
        if self.lost:
            return not self.dir_gone
        now = time.time()
        dir_gone = self._watch.dir_gone()
        with self._lock:  # the active segment's fd stays open meanwhile
            if self.lost:  # found by another thread meanwhile (close(), a failed mark write)
                return not self.dir_gone
            if not dir_gone and not self._watch.segment_gone(self._fd):
                self._watch.intact_at = now
                return True
            self.dir_gone = dir_gone  # before `lost`: whoever sees `lost` set sees which was deleted
            if dir_gone:
                self.lost, told = self._watch.dir_lost(now)
            else:
                self.lost, told = self._watch.segment_lost(now, self._path, self.next_seq, self._opened_at)
        log.error("%s", told)
        if self.on_lost is not None:
            self.on_lost()
        return not dir_gone

    def check(self, after_seq: int, rows_seq: int = 0) -> tuple[int, str, str, dict[tuple[str, int], int]]:
        """Reads the journal as replay(after_seq, rows_seq=rows_seq) would, changing nothing. Returns (records
        after after_seq, why replay would refuse to start or "", what replay would cut with a warning or "",
        {(table, dim of its grads): the seq of the first record of them read})."""
        count, reader, tables = 0, self._reader.read(after_seq, False, rows_seq), {}
        try:
            while True:
                rec = next(reader)
                tables.setdefault((rec.table, rec.grads.shape[1]), rec.seq)
                count += 1
        except StopIteration as stop:
            level, text = self._reader.tail_message(stop.value) if stop.value.tail is not None else (0, "")
            return count, "", text if level >= logging.WARNING else "", tables
        except StorageError as e:
            return count, str(e), "", tables

    def trim(self, flushed_seq: int) -> int:
        """Deletes segments whose records all have seq <= flushed_seq, except the active one. Returns count."""
        with self._lock:
            segs = self.segments()
            removed = 0
            for (_first, path), nxt in zip(segs, segs[1:]):
                if nxt[0] - 1 <= flushed_seq:
                    os.remove(path)
                    removed += 1
            if self._fd < 0 and segs and self.next_seq - 1 <= flushed_seq:
                os.remove(segs[-1][1])  # the newest, closed segment is flushed too
                removed += 1
            return removed

    def size_bytes(self) -> int:
        """Bytes in all segments, of the active one only its records (not the space prepared after them). Under
        the lock, as trim() deletes segments under it, so a listed segment is still there when its size is read."""
        total = 0
        with self._lock:
            for _, path in self.segments():
                if path == self._path and self._fd >= 0:  # its prepared tail is not records
                    total += self._segment_size
                    continue
                try:
                    total += os.path.getsize(path)
                except FileNotFoundError:  # removed by something else meanwhile: it holds no bytes now
                    pass
        return total

    # ---- appends --------------------------------------------------------------------------------------
    def append(self, table: str, ids: np.ndarray, grads: np.ndarray, shows: np.ndarray, clicks: np.ndarray,
               step: int, origin: Origin = NO_ORIGIN, rule: int = 0) -> int:  # fmt: skip
        """Appends one push (ids <u8 (n,), grads <f4 (n, dim), shows and clicks <f4 (n,), all C-contiguous),
        the clock step it was applied at, the (client, client_seq, part, digest) it came from and its rule (0..255,
        see the grammar in ps.storage.journalformat); returns its seq once durable (and `applied` records the
        origin)."""
        n, dim = grads.shape
        head = payload_head(table, n, dim, step, origin, rule)
        arrays = [a.view(np.uint8).reshape(-1) for a in (ids, grads, shows, clicks)]  # byte views, no copy
        payload_len = len(head) + sum(len(a) for a in arrays)
        with self._lock:
            if self._failed or self.lost:
                raise DataDirLostError(self.lost) if self.lost else StorageError(self._failed)
            try:
                return self._append(head, arrays, payload_len, origin)
            except OSError as e:
                reason = disk_full_reason(e)
                if reason is None and e.errno == errno.EFBIG and not self._failed:
                    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
                    shown = "unlimited" if limit == resource.RLIM_INFINITY else f"{limit:,} bytes"
                    raise FileTooLargeError(
                        f"the journal's segment in {self.dir} cannot grow by {HEADER.size + payload_len:,} bytes: "
                        f"{e.strerror} (the server's limit on a file's size, `ulimit -f`, is {shown}; or the file "
                        f"system's largest file): raise it (`prlimit --fsize` for the running server); {NOTHING_APPLIED}"
                    ) from e
                if reason is None:
                    raise
                if self._failed:  # freeing space is not enough: the failed record may still be on the disk
                    raise StorageError(self._failed) from e
                raise DiskFullError.of(
                    reason, f"the journal in {self.dir} cannot take a push of {HEADER.size + payload_len:,} bytes"
                ) from e

    def _append(self, head: bytes, arrays: list[np.ndarray], payload_len: int, origin: Origin) -> int:
        """append's write, under the lock. Nothing moves (next_seq, the segment's end, `applied`) until the
        record is whole in the file (and, with sync, durable); a failed write is cut off first (_cut_back)."""
        if self._fd < 0 or self._segment_size >= self.segment_bytes:
            self._open_segment()
        seq = self.next_seq
        total = HEADER.size + payload_len
        if self._map is not None and self._segment_size + total <= self._prefault.mapped_end:
            try:
                self._copy_into_map(seq, payload_len, head, arrays)  # prepared space: memory copies, no syscall
            except BaseException:
                self._cut_back()  # no part of the record may stay after the last whole one
                raise
        else:
            check = checksum64([HEADER_CHECKED.pack(MAGIC, seq, payload_len), head, *arrays])
            try:
                self._write(total, [HEADER.pack(MAGIC, seq, payload_len, check), head, *arrays])
            except BaseException:
                self._cut_back()
                raise
        if self.sync:
            try:
                os.fsync(self._fd)
            except OSError:  # not durable: take the record back, or replay would apply a failed push
                self._cut_back()
                raise
        self._segment_size += total
        self.bytes_written += total
        self.next_seq = seq + 1
        self.note_applied(origin)
        self._prefault.appended(self._segment_size, total)
        return seq

    def _write(self, total: int, parts: list) -> None:
        """Writes the record's parts (total bytes) at the segment's end with pwritev. A short write is what a
        disk that fills up part-way gives; the rest is written once more, which either completes the record (the
        short write had another cause) or fails with the real error (ENOSPC, EDQUOT, EIO, ...). A second short
        write raises OSError, with ENOSPC when the file system has no free blocks left (os.fstatvfs)."""
        written = os.pwritev(self._fd, parts, self._segment_size)
        if written == total:
            return
        more = os.pwritev(self._fd, _after(parts, written), self._segment_size + written)
        if written + more == total:
            return
        text = f"journal write of {total} bytes wrote {written}, then {more} of the remaining {total - written}"
        free = os.fstatvfs(self._fd)
        if free.f_bavail == 0 or free.f_bfree == 0:
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({text}; the file system has no free blocks)")
        raise OSError(text)

    def _copy_into_map(self, seq: int, payload_len: int, head: bytes, arrays: list[np.ndarray]) -> None:
        """Writes a record at the end of the active segment through its mapping: the header first, with a zero
        checksum; then the payload, copied and checksummed in one pass; then the checksum. A crash part-way
        leaves a header whose length covers whatever was copied and whose checksum fails: a torn last record,
        which replay cuts off (never acknowledged). The bytes must be prepared and mapped (ps.accel.prefault: the file
        holds them, or a byte past its end would raise SIGBUS)."""
        pos, dest = self._segment_size, self._map.array
        end = pos + HEADER.size + payload_len
        dest[pos : pos + HEADER.size] = np.frombuffer(HEADER.pack(MAGIC, seq, payload_len, 0), dtype=np.uint8)
        check = copy_with_checksum64([HEADER_CHECKED.pack(MAGIC, seq, payload_len), head, *arrays], 1,
                                     dest[pos + HEADER.size : end])  # fmt: skip
        dest[pos + HEADER_CHECKED.size : pos + HEADER.size] = np.frombuffer(struct.pack("<Q", check), dtype=np.uint8)
        self.mapped_appends += 1
        if end - self._released >= RELEASE_BYTES:  # done with these pages: out of the process's RSS
            self._map.release(self._released, end)
            self._released = end

    def _cut_back(self) -> None:
        """Truncates the active segment to its last whole record (a failed append leaves nothing behind); with
        sync, durably. If that fails too, the journal takes no more appends: the failed record could come back
        after a power loss, and replay would apply a push its client was told had failed."""
        self._prefault.detach()
        try:
            os.ftruncate(self._fd, self._segment_size)
            if self.sync:
                os.fsync(self._fd)
        except OSError as e:
            self._failed = f"journal {self.dir}: a failed append could not be cut off ({e}); restart the server"
            raise
        finally:
            self._prefault.attach(self._fd, self.segment_bytes, self._map)

    def _open_segment(self) -> None:
        """Opens the segment of next_seq. A file of that name may exist only empty (a failed first append, or
        replay cut a torn record off); one holding bytes means the journal was not replayed first."""
        self._close_fd()
        os.makedirs(self.dir, exist_ok=True)
        path = segment_path(self.dir, self.next_seq)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # read too: ps.accel.prefault reads ahead
        if os.fstat(fd).st_size:
            os.close(fd)
            raise StorageError(f"journal segment {path} already holds data: replay the journal before appending")
        self._fd, self._path, self._segment_size = fd, path, 0
        self._opened_at = time.time()
        # with sync, every append's fsync would also write the zero pages mapped ahead (dirty once populated)
        self._map = None if self.sync else FileMap.open(fd, self.segment_bytes)
        self._released = 0  # [0, _released) of _map is released (ps.accel.filemap)
        if self.sync:
            sync_directory(self.dir)
        self._prefault.attach(self._fd, self.segment_bytes, self._map)

    def _close_fd(self) -> None:
        """Closes the active segment, cut to its last record (the prepared space after it goes)."""
        if self._fd >= 0:
            self._prefault.detach()
            if self._map is not None:
                self._map.close()
                self._map = None
            os.ftruncate(self._fd, self._segment_size)
            if self.sync:
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        """Closes the active segment, cut to its last record, writes the mark and stops the prefault and mark
        threads."""
        try:
            with self._lock:
                self._close_fd()
        finally:
            self._prefault.close()
            if self._marker is not None:
                self._marker.close(write=not self.dir_gone)


def _after(parts: list, skip: int) -> list[memoryview]:
    """The buffers `parts` (bytes or arrays) less their first `skip` bytes, as byte views (no copies)."""
    out = []
    for part in parts:
        view = memoryview(part).cast("B")
        if skip >= len(view):
            skip -= len(view)
            continue
        out.append(view[skip:])
        skip = 0
    return out
