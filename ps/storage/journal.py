"""Journal: the push log that makes a push durable before it is acknowledged, replayed at start-up.

Files: <data_dir>/journal/<first_seq:020d>.log, one active segment at a time, a new one started when it
reaches segment_bytes; trim(seq) deletes the segments whose records are all <= seq (their effects are in RocksDB).

Grammar (little-endian):
    segment  := record* zero*
    record   := magic:u32 = 0x354A5350 ("PSJ5")  seq:u64  payload_len:u32  checksum:u64  payload
    payload  := head  ids:u64[n]  grads:f32[n*dim]  shows:f32[n]  clicks:f32[n]
    head     := table_len:u16  table:utf8[table_len]  n:u32  dim:u32  step:u64  client:u64  client_seq:u64  part:u32
                rule:u8
    rule     := 0 (OPTIMIZE: the optimizer step on grads) | 1 (ADD_DELTA: grads added to the embeddings as they
                are), ps.rows.update's rules; replay applies a record by its own rule (ps.engine.table)
    checksum := ps.storage.checksum.checksum64 of the buffers [magic seq payload_len, head, ids, grads, shows, clicks]
The checksum covers the header's magic, seq and payload_len too, so a damaged seq or length fails it like a
damaged payload. (client, client_seq, part) say which push of which client request the record is (0, 0, 0:
none): `applied` (ps.storage.applied.AppliedTable) maps each client to the (client_seq, parts done) of its newest
request, kept as records are appended and replayed, so a shard can tell a retried request from a new one
(ps.engine.pushpath.PushPath.push_batch).

Writing: a record is written with one pwritev; or, where ps.accel.prefault has prepared the space and
ps.accel.filemap has mapped the segment, it is copied into the mapping: the header with a zero checksum, then
the payload copied and checksummed in one pass (copy_with_checksum64), then the checksum. Both ways leave the
same bytes in the file; the mapped copy is optional and never used with sync. With sync=True every append is
fsynced before it returns (it survives power loss, not only a crash of the process). A failed append is cut off
before the error is raised, so the file ends with the last acknowledged record, and takes no seq: the next append
writes the same seq at the same offset. A short pwritev (a disk that filled up part-way) is written on once, to
complete the record or to get the real error; a full disk (ENOSPC, EDQUOT) is a ps.errors.DiskFullError naming
the journal's directory.

Replay rule: a crash of the process leaves at most one short or unchecked record at the end of the active
segment, never acknowledged; replay cuts it off. The active segment's next bytes are allocated ahead of the
appends (ps.accel.prefault) and read as zeros until written: zeros after the last record are unused space, not
damage, and a bad record is judged as torn with them left out (it must be the last nonzero data, and no intact
record may follow it). A closed segment is cut to its last record; an older segment may end in zeros only if
the next segment starts right after its last record, so a zeroed stretch of acknowledged records is damage. Any
other bad record is damage: replay raises JournalCorruptError rather than drop the acknowledged pushes after it.

The mark: a journal given a mark_path keeps there, in a file outside the journal's directory
(ps.storage.sidefiles), the seq of the last record written: written when replay first opens the journal of a
data dir (0 before any record), then at each rotation and at most a second behind the appends (a background
thread; nothing on the append path). Replay requires every record from the first one RocksDB lacks up to the mark,
with no gap: a missing one (a deleted segment, a segment cut at a record boundary or in the middle, a journal
deleted whole) raises JournalLossError, as does a mark missing where RocksDB holds pushes or the journal holds
records (it was deleted: which records should follow is unknown). A missing mark goes unnoticed only with nothing
to show that pushes were written (no flushed push, no journal data). Replay is also given the largest lsn of a row
RocksDB holds (rows_seq): that push's record was written, as every one before it, so they are required as those up
to the mark are, and appends go on past it. Past both, a lost tail looks like the torn
end of a crash: without sync, an OS crash or a power failure can lose pushes that were acknowledged, and the
warning that replay logs when it cuts says so. With accept_loss, replay logs what it cannot find or read instead
of refusing, and goes on with the records it has.

Deleted under the running server: the mark's thread also checks, each time it wakes (check_intact, about once a
second), that the active segment is still linked (os.fstat: st_nlink 0 is a deleted file, which appends would
go on filling with nothing on disk to replay) and that the data dir (the mark's directory) is the one the journal
started in (os.stat: gone, or another inode, a dir removed and made again). Once either is found, `lost` says
what happened, every later append raises ps.errors.DataDirLostError (nothing appended), on_lost is told, and the
mark is no longer written into a data dir that is gone. Appends only read `lost`: no syscall is added to them, so
a push that comes between the deletion and the next check (at most about a second) is still acknowledged.
"""

from __future__ import annotations

import errno
import itertools
import logging
import mmap
import os
import resource
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ps.accel.filemap import FileMap
from ps.accel.prefault import Prefaulter
from ps.errors import DataDirLostError, DiskFullError, FileTooLargeError, StorageError, disk_full_reason
from ps.storage.applied import AppliedChanges, AppliedTable
from ps.storage.atomicfile import sync_directory
from ps.storage.checksum import checksum64, copy_with_checksum64
from ps.storage.sidefiles import MarkWriter, read_mark

log = logging.getLogger(__name__)

MAGIC = 0x354A5350  # "PSJ5"
OLDER_MAGICS = (b"PSJ1", b"PSJ2", b"PSJ3", b"PSJ4")  # formats before this one: refused by name, not as damage
HEADER = struct.Struct("<IQIQ")  # magic, seq, payload_len, checksum
HEADER_CHECKED = struct.Struct("<IQI")  # the header's part the checksum covers: magic, seq, payload_len
PAYLOAD_HEAD = struct.Struct("<IIQQQIB")  # n, dim, step, client, client_seq, part, rule (after the table name)
RELEASE_BYTES = 32 << 20  # appended records leave the process's RSS this many bytes at a time
READ_BYTES = 8 << 20  # replay reads a segment in windows of this (SegmentReader)


class SegmentReader:
    """A segment as replay walks it, read with pread: a record through a window of READ_BYTES read where the record
    starts (its arrays are views of that window, which lives as long as they do), never the whole segment, so
    replay's memory is a window and the records its caller holds. Once a record fails its checks, what follows it
    is judged on the segment read from there on (read_from): a buffer of the segment's size whose bytes before that
    point and after the end of its data (end_of_data, zeros) are never touched, so they take no memory. Reads, not
    a mapping of the file: a file cut under the reader (a live server's flush cuts its active segment back) or a
    failing disk is an OSError naming the segment, or a short read, never SIGBUS."""

    _fd = -1

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        st = os.fstat(self._fd)
        if not stat.S_ISREG(st.st_mode):
            self.close()
            raise IsADirectoryError(errno.EISDIR, "a journal segment must be a file", path)
        self.size = st.st_size
        self._start, self._window = 0, b""
        self._whole: mmap.mmap | bytes | None = None  # read_from's buffer, once it ran
        self._data_end = self.size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()

    def _pread_into(self, view: memoryview, offset: int) -> int:
        """Fills view from offset on (fewer bytes only at the end of the file); returns the bytes read."""
        got = 0
        try:
            while got < len(view):
                n = os.preadv(self._fd, [view[got : got + (1 << 30)]], offset + got)
                if not n:
                    break
                got += n
        except OSError as e:
            raise type(e)(e.errno, e.strerror, self.path) from None
        return got

    def _pread(self, n: int, offset: int) -> bytearray:
        """Up to n bytes at offset (fewer only at the end of the file), read by _pread_into."""
        buf = bytearray(n)
        with memoryview(buf) as view:
            got = self._pread_into(view, offset)
        del buf[got:]
        return buf

    def end_of_data(self) -> int:
        """One past the segment's last nonzero byte (0 if none), read from the back a MB at a time: a prepared tail
        of zeros can be hundreds of MB."""
        end = self.size
        while end > 0:
            lo = max(0, end - (1 << 20))
            found = _end_of_data(self._pread(end - lo, lo), 0)
            if found:
                self._data_end = lo + found
                return self._data_end
            end = lo
        self._data_end = 0
        return 0

    def _covers(self, pos: int, n: int) -> bool:
        """Whether bytes [pos, pos + n) are in the file, read into the window if they were not."""
        if pos + n > self.size:
            return False
        if pos < self._start or pos + n > self._start + len(self._window):
            self._window = b""  # the old window goes before the new one is read
            self._start, self._window = pos, self._pread(max(n, READ_BYTES), pos)
        return pos + n <= self._start + len(self._window)

    def record_at(self, pos: int) -> tuple[Record | None, int]:
        """_parse at pos: (Record, end), or (None, pos) when the bytes there are no intact record. Read through a
        window; where that finds none, judged on the segment read from pos on (read_from), so what is judged is
        what one read saw: a record a live server completed meanwhile parses."""
        if self._whole is None and self._covers(pos, HEADER.size):
            magic, _seq, payload_len, _check = HEADER.unpack_from(self._window, pos - self._start)
            if magic == MAGIC and self._covers(pos, HEADER.size + payload_len):
                rec, end = _parse(self._window, pos - self._start)
                if rec is not None:
                    return rec, end + self._start
        return _parse(self.read_from(pos), pos)

    def read_from(self, pos: int) -> mmap.mmap | bytes:
        """The segment as a buffer of its size, its bytes from pos to the end of its data read in (end_of_data
        must have run; the rest reads as zeros: untouched anonymous memory); record_at reads from it from now on.
        Positions in it are the segment's."""
        if self._whole is None:
            self._window = b""
            self._whole = mmap.mmap(-1, self.size) if self.size else b""
            if self._data_end > pos:
                self._pread_into(memoryview(self._whole)[pos : self._data_end], pos)
        return self._whole


@dataclass
class Record:
    seq: int
    table: str
    ids: np.ndarray  # uint64 (n,)
    grads: np.ndarray  # float32 (n, dim)
    shows: np.ndarray  # float32 (n,)
    clicks: np.ndarray  # float32 (n,)
    step: int  # the shard's clock when the push was applied
    origin: tuple[int, int, int] = (0, 0, 0)  # (client, client_seq, part) of the request; 0s: none
    rule: int = 0  # how the push applies grads: ps.rows.update's OPTIMIZE (0) or ADD_DELTA (1)


class Journal:
    """The push journal in `directory`. Replay it before the first append; appends, trim, mark and
    size_bytes may come from several threads (they take the journal's lock). mark_path: where to keep the mark
    (see the module's docstring; None: no mark), from replay() on."""

    def __init__(self, directory: str, sync: bool = False, segment_bytes: int = 256 << 20,
                 mark_path: str | None = None):  # fmt: skip
        self.dir = directory
        self.mark_path = mark_path
        self._marker: MarkWriter | None = None  # started by replay()
        self.losses: list[str] = []  # what replay went on without (accept_loss)
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
        self._data_dir = os.path.dirname(mark_path) if mark_path else ""  # watched by check_intact
        self._data_dir_id: tuple[int, int] | None = None  # its (st_dev, st_ino) when replay() started the mark
        self._intact_at = 0.0  # time.time() of the last check that found everything in place
        self._opened_at = 0.0  # time.time() when the active segment was opened
        self.next_seq = 1
        self.bytes_written = 0
        self.applied = AppliedTable()  # client -> (client_seq, parts done) of its newest request
        self.replay_bytes = (0, 0)  # (read, to read) of the segments' bytes, as a replay goes: its progress
        self._rows_seq = 0  # the rows_seq of the last replay or check (_witnesses)

    @property
    def mapped_bytes(self) -> int:
        """The size of the segment mapped for appends now (the most of the mapping that can be resident), or 0."""
        return self.segment_bytes if self._map is not None else 0

    def note_applied(self, origin: tuple[int, int, int]) -> None:
        """Records that push `part` of request (client, client_seq) is applied (newest wins; 0 client: none)."""
        client, client_seq, part = origin
        if client:
            self.applied.note(client, client_seq, part)

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
        """(first seq, path) of every segment (a file named as the module's grammar says), oldest first (none if
        the directory is missing: it is made by the first append). JournalCorruptError if its path is not a
        directory."""
        if os.path.lexists(self.dir) and not os.path.isdir(self.dir):
            raise JournalCorruptError(
                f"the journal {self.dir} is a file, not the directory of journal segments: damage to the data dir, "
                "or a file put there by mistake. Refusing to start; move it away and start again (the journal mark "
                "then says whether acknowledged pushes are missing)"
            )
        out = []
        for name in os.listdir(self.dir) if os.path.isdir(self.dir) else []:
            if len(name) == 24 and name.endswith(".log") and name[:-4].isdigit():
                out.append((int(name[:-4]), os.path.join(self.dir, name)))
        return sorted(out)

    def replay(self, after_seq: int, accept_loss: bool = False, rows_seq: int = 0) -> Iterator[Record]:
        """Yields the intact records with seq > after_seq (the last one RocksDB holds), in order; afterwards
        appends continue past them, past the mark and past rows_seq, and the mark is kept from now on. rows_seq:
        the largest lsn of a row RocksDB holds (ps.storage.store.Store.written_seq): that record was written, as
        every one before it, like those up to the mark (a row written back before a flush can hold a push the
        mark does not cover yet); a new push must get a seq above it, or a later replay would skip it on that row.

        A bad record that the module's replay rule takes for the torn end of a crash is cut off, with the zeros
        after it. Any other bad record raises JournalCorruptError, and a record missing up to the mark or
        rows_seq raises JournalLossError, before anything is cut; with accept_loss, each is a warning (kept in
        `losses`)."""
        last, mark, written, tail = yield from self._read(after_seq, accept_loss, rows_seq)
        if tail is not None:
            level, text = self._tail_message(*tail, last, mark, written)
            log.log(level, "%s", text)
            with open(tail[0], "r+b") as f:
                f.truncate(tail[2])
        self.next_seq = max(last, written) + 1
        if self.mark_path is not None:
            try:
                st = os.stat(self._data_dir)
                self._data_dir_id = (st.st_dev, st.st_ino)
            except OSError:  # no dir to watch: only the segment is checked
                self._data_dir_id = None
            self._intact_at = time.time()
            present = os.path.exists(self.mark_path)  # else a new data dir, or a loss accepted above: marked now
            self._marker = MarkWriter(self.mark_path, lambda: self.next_seq - 1, mark if present else -1,
                                      sync_dir=self.sync, check=self.check_intact)  # fmt: skip
            if not present:
                self._marker.write()

    def seems_lost(self) -> bool:
        """Whether the journal found its data dir or active segment gone (`lost`), or its next check_intact would:
        the same two syscalls, with no lock taken and nothing changed, for a signal handler (the thread it
        interrupts may hold the lock). A segment closed meanwhile reads as intact."""
        return bool(self.lost) or self._dir_gone() or self._segment_gone(self._fd)

    def _dir_gone(self) -> bool:
        """Whether the data dir the journal started in is gone or replaced (one os.stat)."""
        if self._data_dir_id is None:
            return False
        try:
            st = os.stat(self._data_dir)
        except (FileNotFoundError, NotADirectoryError):
            return True
        except OSError:  # a permission, an I/O error: no sign of a deletion; the writes say what is wrong
            return False
        return (st.st_dev, st.st_ino) != self._data_dir_id

    @staticmethod
    def _segment_gone(fd: int) -> bool:
        """Whether the segment open as fd (-1: none) was deleted (one os.fstat; a closed fd reads as intact)."""
        try:
            return fd >= 0 and os.fstat(fd).st_nlink == 0
        except OSError:
            return False

    def check_intact(self) -> bool:
        """Whether the data dir is still the one the journal started in (see the module's docstring); on the first
        check that finds it gone or replaced, or the active segment deleted, sets `lost` (appends are refused from
        then on), logs one ERROR line saying what happened and calls on_lost. Returns False while the data dir is
        gone (the mark cannot be written there), True otherwise. Called by the mark's thread, about once a second;
        two syscalls (os.stat, os.fstat), none on the append path."""
        if self.lost:
            return not self.dir_gone
        now = time.time()
        dir_gone = self._dir_gone()
        with self._lock:  # the active segment's fd stays open meanwhile
            if self.lost:  # found by another thread meanwhile (close(), a failed mark write)
                return not self.dir_gone
            segment_gone = self._segment_gone(self._fd)
            if not dir_gone and not segment_gone:
                self._intact_at = now
                return True
            when, since = _clock(now), _clock(self._intact_at)
            if dir_gone:
                self.lost = (f"its data dir {self._data_dir} was deleted or replaced under the running server "
                             f"(between {since} and {when}): pushes since {since} could not be kept. Restart the "
                             "server on an intact data dir (a backup, or --restore of a checkpoint); nothing was "
                             "applied")  # fmt: skip
                told = (f"the data dir {self._data_dir} was deleted or replaced under the running server (found at "
                        f"{when}; it was in place at {since}): RocksDB's files, the journal and its mark are no "
                        "longer in it, so nothing this server acknowledged since its last flush can be kept, and a "
                        "restart on that path would find them missing (or start a new, empty shard where the dir "
                        "is gone). This server takes no more writes (FAILED_PRECONDITION) and reports NOT_SERVING; "
                        "restart it on an intact data dir (a backup, or --restore of a checkpoint)")  # fmt: skip
            else:
                first = int(os.path.basename(self._path)[:-4])
                held = (f"records {first:,} to {self.next_seq - 1:,}, acknowledged since {_clock(self._opened_at)}"
                        if self.next_seq > first else "no record yet")  # fmt: skip
                self.lost = (f"its journal segment {self._path} was deleted under the running server (between "
                             f"{since} and {when}): pushes since {_clock(self._opened_at)} could not be kept in the "
                             "journal. Restart the server (SIGTERM: its stop writes every acknowledged push to "
                             "RocksDB; then start it again) on its data dir, intact otherwise; nothing was "
                             "applied")  # fmt: skip
                told = (f"the journal segment {self._path} was deleted under the running server (found at {when}; "
                        f"it was there at {since}): the pushes it held ({held}) are in no file, only in this "
                        "server's memory until a flush writes their rows to RocksDB (one is started now). This "
                        "server takes no more writes (FAILED_PRECONDITION) and reports NOT_SERVING; stop it with "
                        "SIGTERM (its stop writes every row to RocksDB; a kill -9 before a flush loses those "
                        "pushes) and start it again")  # fmt: skip
            self.dir_gone = dir_gone
        log.error("%s", told)
        if self.on_lost is not None:
            self.on_lost()
        return not dir_gone

    def check(self, after_seq: int, rows_seq: int = 0) -> tuple[int, str, str, dict[tuple[str, int], int]]:
        """Reads the journal as replay(after_seq, rows_seq=rows_seq) would, changing nothing. Returns (records
        after after_seq, why replay would refuse to start or "", what replay would cut with a warning or "",
        {(table, dim of its grads): the seq of the first record of them read})."""
        count, reader, tables = 0, self._read(after_seq, False, rows_seq), {}
        try:
            while True:
                rec = next(reader)
                tables.setdefault((rec.table, rec.grads.shape[1]), rec.seq)
                count += 1
        except StopIteration as stop:
            last, mark, written, tail = stop.value
            level, text = self._tail_message(*tail, last, mark, written) if tail is not None else (0, "")
            return count, "", text if level >= logging.WARNING else "", tables
        except StorageError as e:
            return count, str(e), "", tables

    def _read(self, after_seq: int, accept_loss: bool, rows_seq: int):
        """replay's reading: yields the records, checks them against the mark and rows_seq, cuts nothing; returns
        (the last seq read, the mark, the last record known to be written: the larger of the mark and rows_seq,
        (path, size, pos, data_end) of a torn end to cut or None)."""
        mark, marked = self._read_mark(accept_loss, after_seq)
        self._rows_seq = rows_seq  # what the messages name (_witnesses)
        written = max(mark, rows_seq)
        last = expect = after_seq  # expect: the last record after after_seq yielded so far
        tail = None
        damaged = None  # (segment, byte) of damage replay went on past (accept_loss), until the next record
        whole = False  # whether the bad bytes at the torn end are as long as the record their header announces
        segs = self.segments()
        sizes = [_file_size(path) for _, path in segs]
        for i, (first, path) in enumerate(segs):
            segment = SegmentReader(path)
            try:
                sizes[i] = segment.end_of_data()  # a prepared tail of zeros is no work
                done, total = sum(sizes[:i]), sum(sizes)
                pos = 0
                seg_last = first - 1  # the seq of the segment's last record so far
                while pos < segment.size:
                    rec, end = segment.record_at(pos) if pos < sizes[i] else (None, pos)  # after sizes[i]: zeros
                    if rec is None:
                        newest = i == len(segs) - 1
                        if pos >= sizes[i] and (newest or segs[i + 1][0] == seg_last + 1):  # zeros to the end: unused
                            if newest:  # space prepared ahead, nothing read; cut off as the rule below would
                                tail = (path, segment.size, pos, pos)
                            break
                        data = segment.read_from(pos)  # what follows a bad record: judged on the segment from here on
                        data_end = _end_of_data(data, pos, sizes[i])  # zeros after sizes[i]: not looked at
                        unused = data_end == pos and (newest or segs[i + 1][0] == seg_last + 1)
                        if data[pos : pos + 4] in OLDER_MAGICS:
                            self._lose(JournalCorruptError(
                                f"journal segment {path} holds a record of an older journal format "
                                f"({data[pos:pos + 4].decode('ascii', 'replace')}) at byte {pos}; this server reads "
                                "PSJ5. Refusing to start; stop the server version that wrote it cleanly (a clean stop "
                                "writes every push to RocksDB), or start with --accept-journal-loss to go on without "
                                "those pushes"
                            ), accept_loss)  # fmt: skip
                        elif not unused and (not newest or not _torn_tail(data, pos, data_end)):
                            self._lose(JournalCorruptError(
                                f"journal segment {path} is corrupt at byte {pos} of {len(data)} (after record "
                                f"{last}), with "
                                f"{'data after it' if newest else f'{len(segs) - 1 - i} segments after it'}"
                                ": that is damage, not the torn last record of a crash. Refusing to start (cut there, "
                                "the journal would lose the acknowledged pushes after it); restore the data dir, or "
                                "start with --accept-journal-loss to go on without the pushes in the damaged bytes"
                            ), accept_loss)  # fmt: skip
                            damaged = (path, pos)  # accepted: replay goes on with the next intact record
                            resume = _next_intact(data, pos + 1, sizes[i])  # a record starts before the zeros
                            if resume is not None:
                                pos = resume
                                continue
                        elif newest:
                            tail = (path, len(data), pos, data_end)
                            whole = _holds_a_whole_record(data, pos, len(data))  # its own zeros count: a push's last
                            # floats are often 0.0
                        break
                    pos = end
                    self.replay_bytes = (done + pos, total)
                    seg_last = rec.seq
                    last = max(last, rec.seq)
                    self.note_applied(rec.origin)
                    if rec.seq > after_seq:
                        if rec.seq <= expect:
                            raise JournalCorruptError(f"journal segment {path} holds record {rec.seq} after record "
                                                      f"{expect}: segments overlap; refusing to start")  # fmt: skip
                        if rec.seq > expect + 1:
                            self._lose(
                                self._in_damage(expect + 1, rec.seq - 1, damaged)
                                if damaged
                                else self._missing(expect + 1, rec.seq - 1, after_seq, mark, path),
                                accept_loss,
                            )
                        damaged = None
                        expect = rec.seq
                        yield rec
            finally:  # also when a refusal or the caller ends the read mid-segment
                segment.close()
        if expect < written:
            if damaged:
                error = self._in_damage(expect + 1, written, damaged)
            elif whole:
                error = self._damaged_end(tail, expect + 1, written, mark)
            else:
                error = self._missing(expect + 1, written, after_seq, mark, None)
            self._lose(error, accept_loss)
        if not marked and after_seq == 0 and (last > 0 or (tail is not None and tail[3] > tail[2])):
            self._lose(self._unmarked(last, segs), accept_loss)
        return last, mark, written, tail

    @staticmethod
    def _in_damage(lo: int, hi: int, damaged: tuple[str, int]) -> JournalCorruptError:
        """The loss of records lo..hi that were in damaged bytes (damaged: the segment and where they begin),
        which replay went on past (--accept-journal-loss)."""
        count = f"{hi - lo + 1} pushes" if hi > lo else "1 push"
        return JournalCorruptError(
            f"journal records {lo}..{hi} ({count}, which may have been acknowledged) were in the damaged bytes of "
            f"{damaged[0]} from byte {damaged[1]} on; replay goes on with the intact records after them."
        )

    def _damaged_end(self, tail: tuple[str, int, int, int], first: int, written: int, mark: int) -> JournalCorruptError:
        """The error for a whole record at the end of the newest segment (tail: path, size, pos, data_end) that
        fails its checks where the mark (or RocksDB's rows: _witnesses) says records first..written were written:
        damage, not a torn record (a cut one, shorter than its header and its payload's head say, is a loss:
        _missing)."""
        path, _size, pos, data_end = tail
        more = f" (and {written - first} written after it)" if written > first else ""
        return JournalCorruptError(
            f"journal segment {path} is corrupt at byte {pos} ({data_end - pos} bytes there fail a record's checks), "
            f"where record {first}{more} should be: {' and '.join(self._witnesses(first, mark))}, so that is "
            "damage, not the torn last record of a crash. Refusing to start; restore the data dir, or start with "
            "--accept-journal-loss to go on without the pushes from there on"
        )

    def _witnesses(self, lo: int, mark: int) -> list[str]:
        """What says record lo was written: the mark, and RocksDB's rows (the rows_seq _read was given)."""
        why = []
        if mark >= lo:
            why.append(f"the journal mark ({self.mark_path}) says records up to {mark} were written")
        if self._rows_seq >= lo:
            why.append(f"RocksDB holds a row that record {self._rows_seq} pushed (written back before a flush), so "
                       f"records up to {self._rows_seq} were written")  # fmt: skip
        return why

    def _read_mark(self, accept_loss: bool, after_seq: int) -> tuple[int, bool]:
        """(the mark, 0 if none; whether the mark file is there, or no mark is kept). A mark file that is
        unreadable, or missing while RocksDB holds pushes (after_seq > 0: every flush writes the mark first), is a
        loss: which records must be there is unknown. A mark missing while RocksDB holds none and the journal holds
        records is _read's to find (_unmarked)."""
        if self.mark_path is None:
            return 0, True
        unknown = ("Without the mark, which journal records must be there is unknown. Refusing to start; start with "
                   "--accept-journal-loss to start without that check")  # fmt: skip
        try:
            mark = read_mark(self.mark_path)
        except StorageError as e:
            self._lose(JournalLossError(f"{e}. {unknown}"), accept_loss)
            return 0, True
        present = os.path.exists(self.mark_path)
        if after_seq > 0 and not present:
            self._lose(JournalLossError(
                f"the journal mark {self.mark_path} is missing, though RocksDB holds the pushes up to journal record "
                f"{after_seq} (each flush writes the mark first): it was deleted. {unknown}"
            ), accept_loss)  # fmt: skip
        return mark, present

    def _unmarked(self, last: int, segs: list[tuple[int, str]]) -> JournalLossError:
        """The loss when the mark is missing though the journal holds data (records up to `last`, 0: only the
        bytes of a torn one) and RocksDB none: a server writes the mark when it first opens a journal (replay),
        before any append, so the mark was deleted, and records written after those found may be missing too."""
        held = f"records up to {last}" if last > 0 else "the bytes of a record"
        return JournalLossError(
            f"the journal mark {self.mark_path} is missing, though the journal ({len(segs)} segment"
            f"{'s' if len(segs) != 1 else ''} in {self.dir}) holds {held} (a server writes the mark when it starts "
            "on a data dir, before its first push): it was deleted, and the records after those found may be missing "
            "too (or it was never written: a server version that wrote it only after a second, killed within that "
            "second, or a write at start-up that failed, which the log said). Without the mark, which journal "
            "records must be there is unknown. Refusing to start; restore the data dir, or start with "
            "--accept-journal-loss to go on with the records found"
        )

    def _missing(self, lo: int, hi: int, after_seq: int, mark: int, resumes_in: str | None) -> JournalLossError:
        """The error for journal records lo..hi missing (resumes_in: the segment that holds the record after hi)."""
        flushed = (
            f"RocksDB holds the pushes up to record {after_seq}"
            if after_seq
            else "no flush has written a push to RocksDB yet"
        )
        why = [flushed, *self._witnesses(lo, mark)]
        if resumes_in is not None:
            why.append(f"the journal goes on with record {hi + 1} in {resumes_in}")
        return JournalLossError(
            f"journal records {lo}..{hi} in {self.dir} are missing ({hi - lo + 1} pushes, which may have been "
            f"acknowledged): {', and '.join(why)}. A deleted or truncated journal segment, or RocksDB losing its "
            "latest writes (its write-ahead log, *.log), leaves such a gap"
            + ("" if self.sync else "; so can an OS crash or a power failure, as the journal runs without --sync")
            + ". Refusing to start; restore the data dir, or start with --accept-journal-loss to go on without them"
        )

    def _lose(self, error: StorageError, accept_loss: bool) -> None:
        """Raises error, or (accept_loss) logs it as a warning and records it in `losses`."""
        if not accept_loss:
            raise error
        text = str(error).split(" Refusing to start")[0] + " Starting anyway (--accept-journal-loss)."
        log.warning("%s", text)
        self.losses.append(text)

    def _tail_message(self, path: str, size: int, pos: int, data_end: int, last: int, mark: int,
                      written: int) -> tuple[int, str]:  # fmt: skip
        """(log level, text) for cutting the newest segment (size bytes) after its last intact record, at pos:
        zeros only (space prepared ahead of appends), or a torn record (nonzero bytes up to data_end); written: the
        last record known to be written (_read)."""
        head = f"journal segment {path}: cut {size - pos} bytes after record {last}"
        if data_end == pos:
            return logging.INFO, f"{head} (zeros: unused space prepared ahead)"
        if self.sync:
            why = ("The journal runs with --sync: after a crash of the process or of the machine, this is the push "
                   "that was being written, never acknowledged")  # fmt: skip
        else:
            why = ("If the process was killed, this is the push that was being written, never acknowledged. The "
                   "journal runs without --sync: after an OS crash or a power failure, it can also be pushes that "
                   "were acknowledged and had not reached the disk")  # fmt: skip
        if written > last:  # only with accept_loss: the loss was logged
            return logging.WARNING, (f"{head}: bytes that are not a whole record, where "
                                     f"{' and '.join(self._witnesses(last + 1, mark))} (the loss logged above)")  # fmt: skip
        marked = f" (every record up to the journal mark, {mark}, is here)" if mark else ""
        return logging.WARNING, f"{head}: a record that is not whole{marked}. {why}"

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
               step: int, origin: tuple[int, int, int] = (0, 0, 0), rule: int = 0) -> int:  # fmt: skip
        """Appends one push (ids <u8 (n,), grads <f4 (n, dim), shows and clicks <f4 (n,), all C-contiguous),
        the clock step it was applied at, the (client, client_seq, part) it came from and its rule (0..255, see
        the grammar); returns its seq once durable (and `applied` records the origin)."""
        n, dim = grads.shape
        name = table.encode()
        head = struct.pack("<H", len(name)) + name + PAYLOAD_HEAD.pack(n, dim, step, *origin, rule)
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
                        "system's largest file): raise it (`prlimit --fsize` for the running server); nothing was applied"
                    ) from e
                if reason is None:
                    raise
                if self._failed:  # freeing space is not enough: the failed record may still be on the disk
                    raise StorageError(self._failed) from e
                raise DiskFullError.of(
                    reason, f"the journal in {self.dir} cannot take a push of {HEADER.size + payload_len:,} bytes"
                ) from e

    def _append(self, head: bytes, arrays: list[np.ndarray], payload_len: int, origin: tuple[int, int, int]) -> int:
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
        path = os.path.join(self.dir, f"{self.next_seq:020d}.log")
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


class JournalCorruptError(StorageError):
    """A journal record that fails its checks with intact data after it: damage, refused at start-up."""


class JournalLossError(StorageError):
    """Journal records that were written (up to the mark, or before a record that is there) are missing, or the
    mark cannot be read: refused at start-up unless the loss is accepted."""


def _clock(t: float) -> str:
    """A wall-clock time for a message: '2026-12-04 12:41:20 UTC' (local time, with its zone)."""
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


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


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # reading it says what is wrong
        return 0


def _end_of_data(data: bytes, pos: int, end: int | None = None) -> int:
    """Where data stops being anything but zeros: one past its last nonzero byte at or after pos (pos if none),
    looking no further than end (None: the end of data; what lies past it is taken for zeros)."""
    a = np.frombuffer(data, dtype=np.uint8)
    end = len(a) if end is None else min(end, len(a))
    while end > pos:  # from the back, a MB at a time: a prepared tail can be hundreds of MB
        lo = max(pos, end - (1 << 20))
        nonzero = np.flatnonzero(a[lo:end])
        if len(nonzero):
            return lo + int(nonzero[-1]) + 1
        end = lo
    return pos


def _holds_a_whole_record(data: bytes, pos: int, end: int) -> bool:
    """Whether data[pos:end] is at least as long as the record its header announces, or as its payload's head
    announces (table name, n, dim): a damaged length field can announce more bytes than the record holds, where a
    record cut short holds fewer than both (a header of this format)."""
    if end - pos < HEADER.size:
        return False
    magic, _seq, payload_len, _check = HEADER.unpack_from(data, pos)
    if magic != MAGIC:
        return False
    if end - pos >= HEADER.size + payload_len:
        return True
    start = pos + HEADER.size
    if end - start < 2:
        return False
    (name_len,) = struct.unpack_from("<H", data, start)
    p = start + 2 + name_len
    if end - p < PAYLOAD_HEAD.size:
        return False
    n, dim = struct.unpack_from("<II", data, p)
    return end - p >= PAYLOAD_HEAD.size + sum(_array_bytes(n, dim))


def _array_bytes(n: int, dim: int) -> list[int]:
    """The bytes of a payload's arrays after its head, in order: ids, grads, shows, clicks (the grammar)."""
    return [8 * n, 4 * n * dim, 4 * n, 4 * n]


def _torn_tail(data: bytes, pos: int, end: int) -> bool:
    """True if the bad record at pos can be what a crash leaves: the last record, cut short or (power loss)
    whole but with unwritten pages, followed by nothing but the zeros of prepared space (end: _end_of_data(data,
    pos)). So nothing after it may parse as an intact record, and it must reach the last nonzero byte: a damaged
    length field can make a record look like it runs to the end of the file."""
    if end == pos:  # only zeros: unused space
        return True
    if _next_intact(data, pos + 1, end) is not None:
        return False
    if end - pos < HEADER.size:
        return True
    magic, _, payload_len, _ = HEADER.unpack_from(data, pos)
    return magic == MAGIC and pos + HEADER.size + payload_len >= end  # nothing but zeros after its declared end


def _next_intact(data: bytes, start: int, end: int) -> int | None:
    """Where the first intact record that begins in data[start:end] begins (None if there is none)."""
    magic = MAGIC.to_bytes(4, "little")
    at = data.find(magic, start, end)
    while at >= 0:
        if _parse(data, at)[0] is not None:
            return at
        at = data.find(magic, at + 1, end)
    return None


def _parse(data: bytes, pos: int) -> tuple[Record | None, int]:
    """(Record, end) of the record at pos, or (None, pos) if it is short or fails its checks."""
    if pos + HEADER.size > len(data):
        return None, pos
    magic, seq, payload_len, check = HEADER.unpack_from(data, pos)
    start = pos + HEADER.size
    end = start + payload_len
    if magic != MAGIC or end > len(data) or start + 2 > end:
        return None, pos
    (name_len,) = struct.unpack_from("<H", data, start)
    p = start + 2 + name_len
    if p + PAYLOAD_HEAD.size > end:
        return None, pos
    n, dim, step, client, client_seq, part, rule = PAYLOAD_HEAD.unpack_from(data, p)
    p += PAYLOAD_HEAD.size
    ends = list(itertools.accumulate([p, *_array_bytes(n, dim)]))  # ends of head, ids, grads, shows, clicks
    if ends[-1] != end:
        return None, pos
    view = memoryview(data)
    covered = [HEADER_CHECKED.pack(magic, seq, payload_len)] + [view[a:b] for a, b in zip([start, *ends], ends)]
    if checksum64(covered) != check:
        return None, pos
    try:
        table = data[start + 2 : start + 2 + name_len].decode()
    except UnicodeDecodeError:
        return None, pos
    ids = np.frombuffer(data, dtype="<u8", count=n, offset=p)
    p += 8 * n
    grads = np.frombuffer(data, dtype="<f4", count=n * dim, offset=p).reshape(n, dim)
    p += 4 * n * dim
    shows = np.frombuffer(data, dtype="<f4", count=n, offset=p)
    clicks = np.frombuffer(data, dtype="<f4", count=n, offset=p + 4 * n)
    return Record(seq, table, ids, grads, shows, clicks, step, (client, client_seq, part), rule), end
