"""Journal replay's reading: the segments read record by record and checked against the mark and RocksDB, every
record missing or damaged named, and the torn end of a crash found and cut (JournalReader).

Replay rule: a crash of the process leaves at most one short or unchecked record at the end of the active
segment, never acknowledged; replay cuts it off. The active segment's next bytes are allocated ahead of the
appends (ps.accel.prefault) and read as zeros until written: zeros after the last record are unused space, not
damage, and a bad record is judged as torn with them left out (it must be the last nonzero data, and no intact
record may follow it: ps.storage.journalformat.torn_tail). A closed segment is cut to its last record; an older
segment may end in zeros only if the next segment starts right after its last record, so a zeroed stretch of
acknowledged records is damage. Any other bad record is damage: replay raises JournalCorruptError rather than
drop the acknowledged pushes after it.

The mark (ps.storage.journal keeps it: the seq of the last record written, in a file outside the journal's
directory, ps.storage.sidefiles): replay requires every record from the first one RocksDB lacks up to the mark,
with no gap: a missing one (a deleted segment, a segment cut at a record boundary or in the middle, a journal
deleted whole) raises JournalLossError, as does a mark missing where RocksDB holds pushes or the journal holds
records (it was deleted: which records should follow is unknown). A missing mark goes unnoticed only with nothing
to show that pushes were written (no flushed push, no journal data). Replay is also given the largest lsn of a row
RocksDB holds (rows_seq): that push's record was written, as every one before it, so they are required as those up
to the mark are. Past both, a lost tail looks like the torn end of a crash: without sync, an OS crash or a power
failure can lose pushes that were acknowledged, and the warning that replay logs when it cuts says so. With
accept_loss, replay logs what it cannot find or read instead of refusing, and goes on with the records it has.

A long replay's progress line (replay_progress, logged by ps.engine.opening every ps.progress.LOG_EVERY_S) gives the
records so far, the bytes read of those the segments hold, the rate and the time left (ps.progress.pace).
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Callable, Generator
from typing import NamedTuple

from ps.bytesize import human_bytes
from ps.errors import StorageError
from ps.progress import pace
from ps.storage.journalformat import (
    OLDER_MAGICS,
    JournalCorruptError,
    JournalLossError,
    Origin,
    Record,
    SegmentReader,
    end_of_data,
    holds_a_whole_record,
    intact_but_its_magic,
    list_segments,
    next_intact,
    torn_tail,
)
from ps.storage.sidefiles import read_mark

log = logging.getLogger(__name__)


def replay_progress(records: int, seq: int, read: tuple[int, int], took_s: float) -> str:
    """A long replay's progress line: "replaying: 120,000 journal records so far (at record 1,234,567), 96.0 MiB of
    about 240.0 MiB read (40%), 12.0 MiB/s, about 12 s left". read: (bytes read, bytes to read) of the segments
    (JournalReader.progress: the newest segment's zeros prepared ahead count until it is read, so the total is an
    estimate); took_s: since the replay began. A total the read reached shows no time left."""
    done, total = read
    bytes_read = pace(done, total, took_s, "read", per_s="/s", show=human_bytes)
    return f"replaying: {records:,} journal records so far (at record {seq:,}), {bytes_read}"


class ReadEnd(NamedTuple):
    """What a read of the journal found, once it yielded every record."""

    last: int  # the last seq read
    mark: int  # the mark (0: none)
    written: int  # the last record known to be written: the larger of the mark and rows_seq
    tail: tuple[str, int, int, int] | None  # (path, size, pos, data_end) of a torn end to cut, or None
    mark_read: bool  # whether the mark file is there and reads (False: missing, or damaged and accepted)


class _ReadState:
    """What one read of the journal carries from segment to segment."""

    __slots__ = ("after_seq", "accept_loss", "mark", "last", "expect", "tail", "damaged", "whole")

    def __init__(self, after_seq: int, accept_loss: bool, mark: int):
        self.after_seq = after_seq  # the last record RocksDB holds
        self.accept_loss = accept_loss
        self.mark = mark  # the mark (0: none)
        self.last = self.expect = after_seq  # last: the last seq read; expect: the last record yielded so far
        self.tail: tuple[str, int, int, int] | None = None  # (path, size, pos, data_end) of a torn end to cut
        self.damaged: tuple[str, int] | None = None  # (segment, byte) of damage gone past, until the next record
        self.whole = False  # whether the bad bytes at the torn end are as long as the record their header announces


class JournalReader:
    """Reads of the journal in `directory` (ps.storage.journal.Journal builds one, which its replay and check
    share), checked against the mark in mark_path (None: no mark kept); sync: whether the journal runs with --sync
    (its messages say what a loss can come from). note_applied is told the origin of every record read
    (AppliedTable's notes). `losses` holds what a read with accept_loss went on without; `progress` is (bytes read,
    bytes to read) of the segments as the read goes."""

    def __init__(self, directory: str, mark_path: str | None, sync: bool,
                 note_applied: Callable[[Origin], None]):  # fmt: skip
        self.dir = directory
        self.mark_path = mark_path
        self.sync = sync
        self._note_applied = note_applied
        self.losses: list[str] = []
        self.progress = (0, 0)
        self._rows_seq = 0  # the rows_seq of the read (_witnesses)

    def cut_tail(self, end: ReadEnd) -> None:
        """Cuts the newest segment after its last intact record (end.tail; nothing if None), logging what was cut:
        zeros at INFO, a torn record as a WARNING."""
        if end.tail is None:
            return
        level, text = self.tail_message(end)
        log.log(level, "%s", text)
        with open(end.tail[0], "r+b") as f:
            f.truncate(end.tail[2])

    def read(self, after_seq: int, accept_loss: bool, rows_seq: int) -> Generator[Record, None, ReadEnd]:
        """Yields the intact records with seq > after_seq (the last one RocksDB holds), in order, checked against
        the mark and rows_seq (the largest lsn of a row RocksDB holds); cuts nothing (cut_tail does); returns what
        it found (ReadEnd). A bad record that the replay rule does not take for a torn end raises
        JournalCorruptError, a record missing up to the mark or rows_seq JournalLossError; with accept_loss, each
        is a warning (kept in `losses`)."""
        mark, marked, mark_read = self._read_mark(accept_loss, after_seq)
        self._rows_seq = rows_seq  # what the messages name (_witnesses)
        written = max(mark, rows_seq)
        state = _ReadState(after_seq, accept_loss, mark)
        segs = list_segments(self.dir)
        sizes = [_file_size(path) for _, path in segs]
        for i in range(len(segs)):
            yield from self._read_segment(state, segs, sizes, i)
        self._check_end(state, written, marked, segs)
        return ReadEnd(state.last, mark, written, state.tail, mark_read)

    def _read_segment(
        self, state: _ReadState, segs: list[tuple[int, str]], sizes: list[int], i: int
    ) -> Generator[Record, None, None]:
        """Yields the intact records of segment segs[i] with seq > state.after_seq, checking each against the one
        before it (an overlap is damage, a gap a loss); at a bad record, _bad_record says where (or whether) the
        read goes on. sizes: the segments' sizes, sizes[i] set to the segment's end of data here."""
        first, path = segs[i]
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
                    follows = newest or segs[i + 1][0] == seg_last + 1  # the next segment starts after seg_last
                    resume = self._bad_record(state, segment, pos, sizes[i], follows, len(segs) - 1 - i)
                    if resume is None:
                        break
                    pos = resume
                    continue
                pos = end
                self.progress = (done + pos, total)
                seg_last = rec.seq
                state.last = max(state.last, rec.seq)
                self._note_applied(rec.origin)
                if rec.seq > state.after_seq:
                    expect = state.expect
                    if rec.seq <= expect:
                        raise JournalCorruptError(f"journal segment {path} holds record {rec.seq} after record "
                                                  f"{expect}: segments overlap; refusing to start")  # fmt: skip
                    if rec.seq > expect + 1:
                        self._lose(
                            self._in_damage(expect + 1, rec.seq - 1, state.damaged)
                            if state.damaged
                            else self._missing(expect + 1, rec.seq - 1, state.after_seq, state.mark, path),
                            state.accept_loss,
                        )
                    state.damaged = None
                    state.expect = rec.seq
                    yield rec
        finally:  # also when a refusal or the caller ends the read mid-segment
            segment.close()

    def _bad_record(
        self, state: _ReadState, segment: SegmentReader, pos: int, size: int, follows: bool, segments_after: int
    ) -> int | None:
        """Judges the bytes at pos of segment, where no intact record starts (size: the segment's end of data;
        follows: whether the segment is the newest or the next one starts right after its last record so far;
        segments_after: how many segments follow it). Returns where the read of the segment goes on (the next
        intact record, after damage accept_loss went past), or None where it ends; notes a torn end of the newest
        segment in state.tail, and raises or logs damage (_lose)."""
        path, newest = segment.path, segments_after == 0
        if pos >= size and follows:  # zeros to the end: unused
            if newest:  # space prepared ahead, nothing read; cut off as the rule below would
                state.tail = (path, segment.size, pos, pos)
            return None
        data = segment.read_from(pos)  # what follows a bad record: judged on the segment from here on
        data_end = end_of_data(data, pos, size)  # zeros after size: not looked at
        unused = data_end == pos and follows
        if _older_segment(data, pos, size):
            self._lose(_older_format(path, data, pos), state.accept_loss)
        elif not unused and (not newest or not torn_tail(data, pos, data_end)):
            self._lose(_corrupt(path, data, pos, state.last, segments_after), state.accept_loss)
            state.damaged = (path, pos)  # accepted: replay goes on with the next intact record
            return next_intact(data, pos + 1, size)  # a record starts before the zeros
        elif newest:
            state.tail = (path, len(data), pos, data_end)
            state.whole = holds_a_whole_record(data, pos, len(data))  # its own zeros count: a push's last floats
            # are often 0.0
        return None

    def _check_end(self, state: _ReadState, written: int, marked: bool, segs: list[tuple[int, str]]) -> None:
        """Once every segment was read: the records missing up to `written` (lost in damage, a damaged whole record
        at the end, or missing), and a mark missing where the journal holds data (_unmarked), raised or logged."""
        if state.expect < written:
            if state.damaged:
                error = self._in_damage(state.expect + 1, written, state.damaged)
            elif state.whole:
                error = self._damaged_end(state.tail, state.expect + 1, written, state.mark)
            else:
                error = self._missing(state.expect + 1, written, state.after_seq, state.mark, None)
            self._lose(error, state.accept_loss)
        tail = state.tail
        if not marked and state.after_seq == 0 and (state.last > 0 or (tail is not None and tail[3] > tail[2])):
            self._lose(self._unmarked(state.last, segs), state.accept_loss)

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
        """What says record lo was written: the mark, and RocksDB's rows (the rows_seq read was given)."""
        why = []
        if mark >= lo:
            why.append(f"the journal mark ({self.mark_path}) says records up to {mark} were written")
        if self._rows_seq >= lo:
            why.append(f"RocksDB holds a row that record {self._rows_seq} pushed (written back before a flush), so "
                       f"records up to {self._rows_seq} were written")  # fmt: skip
        return why

    def _read_mark(self, accept_loss: bool, after_seq: int) -> tuple[int, bool, bool]:
        """(the mark, 0 if none; whether the mark file is there, or no mark is kept; whether it is there and
        reads, or no mark is kept). A mark file that is unreadable, or missing while RocksDB holds pushes
        (after_seq > 0: every flush writes the mark first), is a loss: which records must be there is unknown. A
        mark missing while RocksDB holds none and the journal holds records is read's to find (_unmarked)."""
        if self.mark_path is None:
            return 0, True, True
        unknown = ("Without the mark, which journal records must be there is unknown. Refusing to start; start with "
                   "--accept-journal-loss to start without that check")  # fmt: skip
        try:
            mark = read_mark(self.mark_path)
        except StorageError as e:
            self._lose(JournalLossError(f"{e}. {unknown}"), accept_loss)
            return 0, True, False
        present = os.path.exists(self.mark_path)
        if after_seq > 0 and not present:
            self._lose(JournalLossError(
                f"the journal mark {self.mark_path} is missing, though RocksDB holds the pushes up to journal record "
                f"{after_seq} (each flush writes the mark first): it was deleted. {unknown}"
            ), accept_loss)  # fmt: skip
        return mark, present, present

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

    def tail_message(self, end: ReadEnd) -> tuple[int, str]:
        """(log level, text) for cutting the newest segment (end.tail: path, size bytes) after its last intact
        record, at pos: zeros only (space prepared ahead of appends), or a torn record (nonzero bytes up to
        data_end); end.written: the last record known to be written."""
        (path, size, pos, data_end), last, mark, written = end.tail, end.last, end.mark, end.written
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


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # reading it says what is wrong
        return 0


def _older_segment(data: mmap.mmap | bytes, pos: int, size: int) -> bool:
    """Whether the bad bytes at pos (size: the segment's end of data) are a segment of a journal format before PSJ5:
    such a magic at its first byte, no PSJ6 or PSJ5 record in it, and the first record none but for its magic. A
    server writes a segment in its own format only, so such a magic after a record it reads, or before one, or on a
    record its checksum verifies, is damage (a bit flipped in a magic: PSJ6 and PSJ4 differ by one, as do PSJ5 and
    PSJ4)."""
    return (pos == 0 and data[:4] in OLDER_MAGICS and next_intact(data, 1, size) is None
            and not intact_but_its_magic(data, 0))  # fmt: skip


def _older_format(path: str, data: mmap.mmap | bytes, pos: int) -> JournalCorruptError:
    """The refusal of a record of an older journal format at pos of segment path."""
    return JournalCorruptError(
        f"journal segment {path} holds a record of an older journal format "
        f"({data[pos:pos + 4].decode('ascii', 'replace')}) at byte {pos}; this server reads "
        "PSJ6 and PSJ5. Refusing to start; stop the server version that wrote it cleanly (a clean stop "
        "writes every push to RocksDB), or start with --accept-journal-loss to go on without "
        "those pushes"
    )  # fmt: skip


def _corrupt(path: str, data: mmap.mmap | bytes, pos: int, last: int, segments_after: int) -> JournalCorruptError:
    """The refusal of damage at pos of segment path (data: the segment), after record `last`, with segments_after
    segments after it (0: the newest, with data after the damage)."""
    return JournalCorruptError(
        f"journal segment {path} is corrupt at byte {pos} of {len(data)} (after record "
        f"{last}), with "
        f"{'data after it' if segments_after == 0 else f'{segments_after} segments after it'}"
        ": that is damage, not the torn last record of a crash. Refusing to start (cut there, "
        "the journal would lose the acknowledged pushes after it); restore the data dir, or "
        "start with --accept-journal-loss to go on without the pushes in the damaged bytes"
    )  # fmt: skip
