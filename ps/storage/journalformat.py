"""The journal's record format: the one place its grammar is written, the structs that pack and unpack it, the
reading of a segment record by record (SegmentReader) and the judging of bad bytes (torn_tail, next_intact).

Files: <data_dir>/journal/<first_seq:020d>.log (segment_path, list_segments): the segments, oldest first; the
journal (ps.storage.journal) writes them, replay (ps.storage.journalreplay) reads them.

Grammar (little-endian):
    segment  := record* zero*
    record   := magic:u32  seq:u64  payload_len:u32  checksum:u64  payload
    magic    := 0x364A5350 ("PSJ6": MAGIC, the records this server writes)
              | 0x354A5350 ("PSJ5": NO_DIGEST_MAGIC, the records of the version before the digest; read only)
    payload  := head  ids:u64[n]  grads:f32[n*dim]  shows:f32[n]  clicks:f32[n]
    head     := table_len:u16  table:utf8[table_len]  n:u32  dim:u32  step:u64  client:u64  client_seq:u64  part:u32
                rule:u8  digest:u64        (a PSJ6 record)
              | table_len:u16  table:utf8[table_len]  n:u32  dim:u32  step:u64  client:u64  client_seq:u64  part:u32
                rule:u8                    (a PSJ5 record: read as digest 0)
    rule     := 0 (OPTIMIZE: the optimizer step on grads) | 1 (ADD_DELTA: grads added to the embeddings as they
                are), ps.rows.update's rules; replay applies a record by its own rule (ps.engine.table)
    digest   := the 64-bit digest of the content of the client request the push is part of (ps.engine.pushpath
                _digest; 0: none kept, as for a push without a client)
    checksum := ps.storage.checksum.checksum64 of the buffers [magic seq payload_len, head, ids, grads, shows, clicks]
The magic says which head a record has, never its length. A server writes PSJ6 records only, each segment in one
format; a PSJ5 segment, left by the version before the digest, replays (its requests' digests unknown), and the
flush that follows a replay that applied records (or else the first flush) deletes it. A server of a version
before PSJ6 refuses a PSJ6 segment (a magic it does not know: damage), so a data dir this server wrote does not
open under it.
The checksum covers the header's magic, seq and payload_len too, so a damaged seq or length fails it like a
damaged payload. (client, client_seq, part, digest), a record's origin, say which push of which client request
the record is, and what that request held (0, 0, 0, 0: none): `applied` (ps.storage.applied.AppliedTable) maps
each client to the (client_seq, parts done, digest) of its newest request, kept as records are appended and
replayed, so a shard can tell a retried request from a new one, and a reused seq from a retry
(ps.engine.pushpath.PushPath.push_batch). A segment of a format before PSJ5 (its first bytes a magic of
OLDER_MAGICS, and no PSJ5 or PSJ6 record in it) is refused by name, not read as damage; such a magic in a segment
of PSJ5 or PSJ6 records is damage (a server writes its own format only).
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import stat
import struct
from dataclasses import dataclass

import numpy as np

from ps.errors import StorageError
from ps.storage.checksum import checksum64

MAGIC = 0x364A5350  # "PSJ6": the records this server writes, their head ending in the digest
NO_DIGEST_MAGIC = 0x354A5350  # "PSJ5": the records of the version before the digest, read only
DIGEST_BYTES = {MAGIC: 8, NO_DIGEST_MAGIC: 0}  # the digest's bytes at the end of the head, by magic: the magics read
_READ_MAGICS = {magic.to_bytes(4, "little") for magic in DIGEST_BYTES}  # b"PSJ6", b"PSJ5"
OLDER_MAGICS = (b"PSJ1", b"PSJ2", b"PSJ3", b"PSJ4")  # formats before PSJ5: their segments refused by name
HEADER = struct.Struct("<IQIQ")  # magic, seq, payload_len, checksum
HEADER_CHECKED = struct.Struct("<IQI")  # the header's part the checksum covers: magic, seq, payload_len
PAYLOAD_HEAD = struct.Struct("<IIQQQIB")  # n, dim, step, client, client_seq, part, rule (after the table name)
DIGEST = struct.Struct("<Q")  # the head's last field in a PSJ6 record (a PSJ5 record has none)
READ_BYTES = 8 << 20  # replay reads a segment in windows of this (SegmentReader)


Origin = tuple[int, int, int, int]  # (client, client_seq, part, digest) of a record: the grammar's fields
NO_ORIGIN: Origin = (0, 0, 0, 0)  # a push of no client request


def payload_head(table: str, n: int, dim: int, step: int, origin: Origin, rule: int) -> bytes:
    """The payload's head (the grammar's `head` of a PSJ6 record, digest included) of a push of n ids of grads of
    dim floats to `table`."""
    name = table.encode()
    client, client_seq, part, digest = origin
    fields = PAYLOAD_HEAD.pack(n, dim, step, client, client_seq, part, rule) + DIGEST.pack(digest)
    return struct.pack("<H", len(name)) + name + fields


def segment_path(directory: str, first_seq: int) -> str:
    """The path of the segment whose first record is first_seq, in the journal directory `directory`."""
    return os.path.join(directory, f"{first_seq:020d}.log")


def list_segments(directory: str) -> list[tuple[int, str]]:
    """(first seq, path) of every segment in `directory` (a file named as segment_path names it), oldest first
    (none if the directory is missing: the journal makes it at its first append). JournalCorruptError if that
    path is not a directory."""
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise JournalCorruptError(
            f"the journal {directory} is a file, not the directory of journal segments: damage to the data dir, "
            "or a file put there by mistake. Refusing to start; move it away and start again (the journal mark "
            "then says whether acknowledged pushes are missing)"
        )
    out = []
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        if len(name) == 24 and name.endswith(".log") and name[:-4].isdigit():
            out.append((int(name[:-4]), os.path.join(directory, name)))
    return sorted(out)


class JournalCorruptError(StorageError):
    """A journal record that fails its checks with intact data after it: damage, refused at start-up."""


class JournalLossError(StorageError):
    """Journal records that were written (up to the mark, or before a record that is there) are missing, or the
    mark cannot be read: refused at start-up unless the loss is accepted."""


@dataclass
class Record:
    """One record as read back: a push, its seq and where it came from (its arrays are views of the bytes read)."""

    seq: int
    table: str
    ids: np.ndarray  # uint64 (n,)
    grads: np.ndarray  # float32 (n, dim)
    shows: np.ndarray  # float32 (n,)
    clicks: np.ndarray  # float32 (n,)
    step: int  # the shard's clock when the push was applied
    origin: Origin = NO_ORIGIN  # (client, client_seq, part, digest) of the request; 0s: none
    rule: int = 0  # how the push applies grads: ps.rows.update's OPTIMIZE (0) or ADD_DELTA (1)


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
            found = end_of_data(self._pread(end - lo, lo), 0)
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
            if magic in DIGEST_BYTES and self._covers(pos, HEADER.size + payload_len):
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


def end_of_data(data: bytes, pos: int, end: int | None = None) -> int:
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


def holds_a_whole_record(data: bytes, pos: int, end: int) -> bool:
    """Whether data[pos:end] is at least as long as the record its header announces, or as its payload's head
    announces (table name, n, dim; the digest where its magic says the head has one): a damaged length field can
    announce more bytes than the record holds, where a record cut short holds fewer than both (a header of PSJ6 or
    PSJ5)."""
    if end - pos < HEADER.size:
        return False
    magic, _seq, payload_len, _check = HEADER.unpack_from(data, pos)
    if magic not in DIGEST_BYTES:
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
    return end - p >= PAYLOAD_HEAD.size + DIGEST_BYTES[magic] + sum(_array_bytes(n, dim))


def _array_bytes(n: int, dim: int) -> list[int]:
    """The bytes of a payload's arrays after its head, in order: ids, grads, shows, clicks (the grammar)."""
    return [8 * n, 4 * n * dim, 4 * n, 4 * n]


def torn_tail(data: bytes, pos: int, end: int) -> bool:
    """True if the bad record at pos can be what a crash leaves: the last record, cut short or (power loss)
    whole but with unwritten pages, followed by nothing but the zeros of prepared space (end: end_of_data(data,
    pos)). So nothing after it may parse as an intact record, and it must reach the last nonzero byte: a damaged
    length field can make a record look like it runs to the end of the file."""
    if end == pos:  # only zeros: unused space
        return True
    if next_intact(data, pos + 1, end) is not None:
        return False
    if end - pos < HEADER.size:
        return True
    magic, _, payload_len, _ = HEADER.unpack_from(data, pos)
    return magic in DIGEST_BYTES and pos + HEADER.size + payload_len >= end  # nothing but zeros after its end


def next_intact(data: bytes, start: int, end: int) -> int | None:
    """Where the first intact record (PSJ6 or PSJ5) that begins in data[start:end] begins (None if there is none)."""
    at = data.find(b"PSJ", start, end)  # the first 3 bytes of either magic
    while at >= 0:
        if at + 4 <= end and bytes(data[at : at + 4]) in _READ_MAGICS and _parse(data, at)[0] is not None:
            return at
        at = data.find(b"PSJ", at + 1, end)
    return None


def intact_but_its_magic(data: bytes, pos: int) -> bool:
    """Whether the bytes at pos are an intact PSJ6 or PSJ5 record but for its magic (one bit flipped in it turns
    PSJ6 into PSJ4 or PSJ2, PSJ5 into PSJ4): the checksum covers the magic, so an older server's record does not
    pass as one."""
    if pos + HEADER.size > len(data):
        return False
    payload_len = HEADER.unpack_from(data, pos)[2]
    end = pos + HEADER.size + payload_len
    if end > len(data):
        return False
    record = bytearray(data[pos:end])
    for magic in DIGEST_BYTES:
        record[:4] = magic.to_bytes(4, "little")
        if _parse(bytes(record), 0)[0] is not None:
            return True
    return False


def _parse(data: bytes, pos: int) -> tuple[Record | None, int]:
    """(Record, end) of the record at pos, or (None, pos) if it is short or fails its checks. Its magic says its
    head: with a digest (PSJ6) or without (PSJ5, read as digest 0)."""
    if pos + HEADER.size > len(data):
        return None, pos
    magic, seq, payload_len, check = HEADER.unpack_from(data, pos)
    start = pos + HEADER.size
    end = start + payload_len
    if magic not in DIGEST_BYTES or end > len(data) or start + 2 > end:
        return None, pos
    (name_len,) = struct.unpack_from("<H", data, start)
    p = start + 2 + name_len
    if p + PAYLOAD_HEAD.size > end:
        return None, pos
    n, dim, step, client, client_seq, part, rule = PAYLOAD_HEAD.unpack_from(data, p)
    p += PAYLOAD_HEAD.size
    arrays = _array_bytes(n, dim)
    has_digest = DIGEST_BYTES[magic] > 0
    p += DIGEST_BYTES[magic]
    ends = list(itertools.accumulate([p, *arrays]))  # ends of head, ids, grads, shows, clicks
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
    digest = DIGEST.unpack_from(data, p - DIGEST.size)[0] if has_digest else 0
    ids = np.frombuffer(data, dtype="<u8", count=n, offset=p)
    p += 8 * n
    grads = np.frombuffer(data, dtype="<f4", count=n * dim, offset=p).reshape(n, dim)
    p += 4 * n * dim
    shows = np.frombuffer(data, dtype="<f4", count=n, offset=p)
    clicks = np.frombuffer(data, dtype="<f4", count=n, offset=p + 4 * n)
    return Record(seq, table, ids, grads, shows, clicks, step, (client, client_seq, part, digest), rule), end
