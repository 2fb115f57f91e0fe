"""Journal records round-trip; a torn last record is cut off and damage is refused; mapped appends; checksum64."""

from __future__ import annotations

import json
import os
import pathlib
import re
import struct

import numpy as np
import pytest

from ps.accel.filemap import MAPPABLE_FILE_SYSTEMS, file_system_type
from ps.errors import StorageError
from ps.rows import parallel
from ps.storage import checksum as checksum_module
from ps.storage import journalformat
from ps.storage.checksum import CHUNK, checksum64, copy_with_checksum64
from ps.storage.journal import Journal
from ps.storage.journalformat import JournalCorruptError, JournalLossError
from tests.waiting import wait_until


def _push(j: Journal, n: int, dim: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 2**64 - 1, n, dtype=np.uint64)
    grads = rng.standard_normal((n, dim)).astype(np.float32)
    shows, clicks = np.ones(n, np.float32), rng.integers(0, 2, n).astype(np.float32)
    return j.append("t", ids, grads, shows, clicks, step=7 + seed), (ids, grads, shows, clicks)


def _replayed(directory: str, after: int = 0):
    return list(Journal(directory).replay(after))


def _one_segment(tmp_path, seeds) -> str:
    """Path of the one segment a journal in tmp_path holds after pushes of 10 ids with these seeds, closed."""
    j = Journal(str(tmp_path))
    for seed in seeds:
        _push(j, 10, seed=seed)
    j.close()
    (path,) = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    return path


def test_records_round_trip_in_order_across_segments(tmp_path):
    j = Journal(str(tmp_path), segment_bytes=300)
    written = [_push(j, n, seed=n) for n in (0, 1, 5, 40, 3)]
    j.close()
    got = _replayed(str(tmp_path))
    assert [r.seq for r in got] == [seq for seq, _ in written] == [1, 2, 3, 4, 5]
    for rec, (_seq, (ids, grads, shows, clicks)) in zip(got, written):
        assert rec.table == "t" and rec.step == 7 + len(ids)
        for a, b in ((rec.ids, ids), (rec.grads, grads), (rec.shows, shows), (rec.clicks, clicks)):
            np.testing.assert_array_equal(a, b)
    assert [r.seq for r in _replayed(str(tmp_path), after=3)] == [4, 5]


@pytest.mark.parametrize("damage", ["torn", "flipped"])
def test_a_damaged_last_record_ends_replay_and_is_cut_off(tmp_path, damage):
    path = _one_segment(tmp_path, (1, 2))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        if damage == "torn":
            f.truncate(size - 5)
        else:  # one bit of one gradient of the second record
            f.seek(size - 100)
            byte = f.read(1)
            f.seek(size - 100)
            f.write(bytes([byte[0] ^ 0x10]))
    j2 = Journal(str(tmp_path))
    assert [r.seq for r in j2.replay(0)] == [1]
    assert os.path.getsize(path) < size
    seq, _ = _push(j2, 2, seed=3)  # appends continue after the intact records
    j2.close()
    assert seq == 2 and [r.seq for r in _replayed(str(tmp_path))] == [1, 2]


@pytest.mark.parametrize("where", ["middle record", "older segment"])
def test_a_damaged_record_with_records_after_it_is_refused_not_dropped(tmp_path, where):
    j = Journal(str(tmp_path), segment_bytes=1 if where == "older segment" else 1 << 20)  # 1: a segment per record
    for seed in (1, 2, 3):
        _push(j, 10, seed=seed)
    j.close()
    path = sorted(os.path.join(tmp_path, f) for f in os.listdir(tmp_path))[0]
    with open(path, "r+b") as f:  # one bit of a gradient of the first record
        f.seek(60)
        byte = f.read(1)
        f.seek(60)
        f.write(bytes([byte[0] ^ 0x10]))
    sizes = {f: os.path.getsize(os.path.join(tmp_path, f)) for f in os.listdir(tmp_path)}
    with pytest.raises(
        JournalCorruptError, match=rf"{os.path.basename(path)} is corrupt at byte 0 .* Refusing to start"
    ):
        list(Journal(str(tmp_path)).replay(0))
    assert {f: os.path.getsize(os.path.join(tmp_path, f)) for f in os.listdir(tmp_path)} == sizes  # nothing cut


def test_a_segment_of_another_format_is_refused_not_cut(tmp_path):
    """The journal reads one record format. A segment an older server wrote (its records of an older magic), even
    one record, is not what a crash leaves (a torn record has this format's header, or too few bytes for one):
    replay refuses it, naming the older format's magic as such rather than as damage."""
    path = _one_segment(tmp_path, (1,))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.write(struct.pack("<I", 0x334A5350))  # its one record's magic: PSJ3
        f.seek(16)
        f.write(bytes(8))  # and a checksum of its own: not this format's over the record
    with pytest.raises(JournalCorruptError, match=r"older journal format \(PSJ3\) at byte 0; .* Refusing"):
        list(Journal(str(tmp_path)).replay(0))
    assert os.path.getsize(path) == size


@pytest.mark.parametrize("where", ["middle", "last", "first", "only"])
def test_an_older_magic_in_a_segment_of_this_format_is_damage(tmp_path, where):
    """A server writes its own format only, so an older magic beside records of this one, or on a record this
    format's checksum verifies (a segment of one record), is damage: one bit flipped turns PSJ6 into PSJ4. Replay
    calls it corrupt, not an older format, and --accept-journal-loss goes on with the intact records after it."""
    seqs = (1,) if where == "only" else (1, 2, 3)
    path = _one_segment(tmp_path, seqs)
    size = os.path.getsize(path)
    at = {"first": 0, "only": 0, "middle": size // 3, "last": 2 * size // 3}[where]
    with open(path, "r+b") as f:
        f.seek(at + 3)
        f.write(bytes([ord("6") ^ 0x02]))  # "PSJ4"
    with pytest.raises(JournalCorruptError, match=rf"is corrupt at byte {at} of {size} .* Refusing") as refused:
        list(Journal(str(tmp_path)).replay(0))
    assert "older journal format" not in str(refused.value)
    assert os.path.getsize(path) == size
    got = [r.seq for r in Journal(str(tmp_path)).replay(0, accept_loss=True)]
    assert got == [seq for seq in seqs if seq != 1 + len(seqs) * at // size]


def test_checksum64_depends_on_every_byte_and_boundary_but_not_on_threads(monkeypatch):
    data = np.random.default_rng(0).integers(0, 256, 3 * CHUNK + 13, dtype=np.uint8)
    base = checksum64([b"head", data])
    for threads in (1, 2, 3):
        monkeypatch.setattr(parallel, "THREADS", threads)
        assert checksum64([b"head", data]) == base
    for pos in (0, 7, CHUNK, 3 * CHUNK + 12):
        flipped = data.copy()
        flipped[pos] ^= 1
        assert checksum64([b"head", flipped]) != base
    assert checksum64([b"ab", b"c"]) != checksum64([b"a", b"bc"])
    assert checksum64([b"", b"x"]) != checksum64([b"x"]) != checksum64([b"x", b""])
    assert checksum64([bytes(8)]) != checksum64([bytes(16)])


@pytest.mark.parametrize("sizes", [[0], [5, 0, 17], [CHUNK], [CHUNK + 1, 3], [2 * CHUNK - 1, 0, 8]])
def test_checksum64_of_small_records_equals_the_parallel_path(monkeypatch, sizes):
    """Records under PARALLEL_BYTES are hashed in one pass on the calling thread: the same function."""
    rng = np.random.default_rng(sum(sizes))
    buffers = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    small = checksum64(buffers)
    monkeypatch.setattr(checksum_module, "PARALLEL_BYTES", 0)
    assert checksum64(buffers) == small


@pytest.mark.parametrize("parallel_bytes", [0, 1 << 40])  # the parallel path, and the one-thread path
@pytest.mark.parametrize("sizes", [[3, 0, 17], [CHUNK + 13, 5, 2 * CHUNK + 1]])
@pytest.mark.parametrize("offset", [0, 1, 5])  # unaligned destinations too (records start anywhere in a segment)
def test_copy_with_checksum64_copies_and_hashes_like_checksum64(monkeypatch, parallel_bytes, sizes, offset):
    monkeypatch.setattr(checksum_module, "PARALLEL_BYTES", parallel_bytes)
    rng = np.random.default_rng(len(sizes) + offset)
    buffers = [b"hashed only"] + [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    total = sum(sizes)
    space = np.full(offset + total + 9, 0xAB, dtype=np.uint8)
    assert copy_with_checksum64(buffers, 1, space[offset : offset + total]) == checksum64(buffers)
    np.testing.assert_array_equal(space[offset : offset + total], np.concatenate(buffers[1:]))
    assert (space[:offset] == 0xAB).all() and (space[offset + total :] == 0xAB).all()  # nothing else written
    with pytest.raises(ValueError, match="bytes to copy into"):
        copy_with_checksum64(buffers, 1, space[: total + 1])


@pytest.mark.parametrize(
    "field, offset, value", [("seq", 4, struct.pack("<Q", 0)), ("length", 12, struct.pack("<I", 2**31 - 1))]
)
def test_a_damaged_header_of_an_early_record_is_refused_not_skipped_or_cut(tmp_path, field, offset, value):
    """The header's seq and length are checksummed too: a zeroed seq would make replay skip the record as
    flushed, a huge length would make it look like a torn last record and cut everything after it."""
    path = _one_segment(tmp_path, (1, 2, 3))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(value)
    with pytest.raises(JournalCorruptError, match="corrupt at byte 0"):
        list(Journal(str(tmp_path)).replay(0))
    assert os.path.getsize(path) == size


def test_size_bytes_while_segments_are_trimmed(tmp_path, monkeypatch):
    """Stats asks for the journal's size while the flusher trims segments: a segment gone between the listing
    and the size read counts 0 bytes rather than failing the call."""
    j = Journal(str(tmp_path / "j"), segment_bytes=1)
    ids, grads = np.arange(3, dtype=np.uint64), np.ones((3, 2), np.float32)
    for _ in range(3):
        j.append("t", ids, grads, np.ones(3, np.float32), np.zeros(3, np.float32), 0)
    segments = j.segments()
    assert len(segments) == 3
    listed = segments + [(99, str(tmp_path / "j" / "00000000000000000099.log"))]  # listed, then removed
    monkeypatch.setattr(j, "segments", lambda: listed)
    assert j.size_bytes() == sum(os.path.getsize(p) for _, p in segments)
    j.close()


def _record_bytes(j: Journal) -> int:
    """Bytes of records in the active segment (the file may be longer: space prepared ahead)."""
    return j._segment_size


def _wait_prepared(path: str, beyond: int) -> None:
    """Waits for the journal's prefault thread to allocate the segment at path past byte `beyond`."""
    wait_until(lambda: os.path.getsize(path) > beyond, 10, f"space prepared past byte {beyond} of {path}")


def test_space_prepared_ahead_reads_as_zeros_and_is_not_damage(tmp_path):
    """A crash leaves the active segment with zeros after its last record (space ps.accel.prefault prepared): replay
    applies every record, cuts the zeros off, and appends continue; a clean close cuts them off itself."""
    j = Journal(str(tmp_path))
    written = [_push(j, 50, seed=s)[0] for s in (1, 2, 3)]
    (path,) = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    records = _record_bytes(j)
    _wait_prepared(path, records)
    with open(path, "rb") as f:
        assert not any(f.read()[records:])  # prepared space is zeros
    j._prefault.close()  # a kill -9: nothing of j runs any more, and its file is not cut to its records
    os.close(j._fd)
    j2 = Journal(str(tmp_path))
    assert [r.seq for r in j2.replay(0)] == written == [1, 2, 3]
    assert os.path.getsize(path) == records
    assert _push(j2, 5, seed=4)[0] == 4
    size = _record_bytes(j2)
    _wait_prepared(j2._path, size)
    j2.close()
    assert os.path.getsize(j2._path) == size  # closed: cut to its records
    assert [r.seq for r in _replayed(str(tmp_path))] == [1, 2, 3, 4]


@pytest.mark.parametrize("cut", [3, 30, 200])  # inside the header, inside the ids, inside the grads
def test_a_torn_last_record_followed_by_prepared_zeros_is_cut_off(tmp_path, cut):
    path = _one_segment(tmp_path, (1, 2))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        data = f.read()
        first_end = size // 2  # both records have the same size
        f.seek(first_end + cut)
        f.write(bytes(size - first_end - cut + (1 << 20)))  # the rest of the record never written, then zeros
    assert [r.seq for r in Journal(str(tmp_path)).replay(0)] == [1]
    assert os.path.getsize(path) == first_end and data[:first_end] == pathlib.Path(path).read_bytes()


def test_a_damaged_record_before_intact_ones_is_refused_even_with_zeros_after(tmp_path):
    path = _one_segment(tmp_path, (1, 2, 3))
    with open(path, "r+b") as f:
        f.seek(60)
        byte = f.read(1)
        f.seek(60)
        f.write(bytes([byte[0] ^ 0x10]))
        f.seek(0, os.SEEK_END)
        f.write(bytes(1 << 20))
    with pytest.raises(JournalCorruptError, match="corrupt at byte 0"):
        list(Journal(str(tmp_path)).replay(0))


@pytest.mark.parametrize("gap", [False, True])
def test_zeros_ending_an_older_segment_are_accepted_only_if_the_next_segment_follows_on(tmp_path, gap):
    """An older segment may end in zeros (say its truncation at close failed); if zeros took the place of its
    last acknowledged records, the next segment does not start right after what is left: damage."""
    j = Journal(str(tmp_path), segment_bytes=1)  # a segment per record
    for seed in (1, 2, 3):
        _push(j, 10, seed=seed)
    j.close()
    first = sorted(os.path.join(tmp_path, f) for f in os.listdir(tmp_path))[0]
    with open(first, "r+b") as f:
        if gap:  # its only record zeroed out: the next segment starts at seq 2, after nothing
            f.write(bytes(os.path.getsize(first)))
        f.seek(0, os.SEEK_END)
        f.write(bytes(1 << 16))
    if gap:
        with pytest.raises(JournalCorruptError, match="corrupt at byte 0"):
            list(Journal(str(tmp_path)).replay(0))
    else:
        assert [r.seq for r in _replayed(str(tmp_path))] == [1, 2, 3]


def test_appending_to_a_journal_that_was_not_replayed_is_refused(tmp_path):
    j = Journal(str(tmp_path))
    _push(j, 3)
    j.close()
    with pytest.raises(StorageError, match="replay the journal before appending"):
        _push(Journal(str(tmp_path)), 3)


def test_an_append_that_cannot_be_cut_off_stops_the_journal(tmp_path, monkeypatch):
    """With sync, a failed fsync takes the record back (truncate, then fsync). If that fails too, the record
    could reappear after a power loss: the journal refuses every later append rather than risk it."""
    j = Journal(str(tmp_path), sync=True)
    _push(j, 3, seed=1)

    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        _push(j, 3, seed=2)
    monkeypatch.undo()
    with pytest.raises(StorageError, match="could not be cut off .* restart the server"):
        _push(j, 3, seed=3)
    j.close()
    assert [r.seq for r in _replayed(str(tmp_path))] == [1]  # the second record was cut off


def test_replay_says_what_it_cut(tmp_path, caplog):
    path = _one_segment(tmp_path, (1, 2))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 5)  # a torn last record ...
        f.seek(0, os.SEEK_END)
        f.write(bytes(4096))  # ... then prepared zeros
    list(Journal(str(tmp_path)).replay(0))
    assert "cut" in caplog.text and "after record 1: a record that is not whole" in caplog.text
    assert "never acknowledged" in caplog.text and "without --sync" in caplog.text  # what a power failure can lose


def _wait_mapped(j: Journal, beyond: int) -> None:
    """Waits for the journal's prefault thread to map and populate its active segment past byte `beyond`."""
    wait_until(lambda: j._prefault.mapped_end > beyond, 10, f"the active segment mapped past byte {beyond}")


@pytest.fixture
def mapped_dir(tmp_path):
    """tmp_path, where the journal maps its segments (ext4, xfs, tmpfs: ps.accel.filemap); the test skips elsewhere."""
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        fs = file_system_type(fd)
    finally:
        os.close(fd)
    if fs not in MAPPABLE_FILE_SYSTEMS:
        pytest.skip(f"the journal maps segments only on ext4, xfs or tmpfs; {tmp_path} is on file system {fs!r}")
    return tmp_path


def test_appends_into_prepared_space_are_copies_that_replay_like_written_ones(mapped_dir):
    """Once space is prepared, appends are memory copies into the mapped segment (ps.accel.filemap), mixed with
    pwritev ones; after a crash (the mapping and the file simply dropped) and after a clean close, every
    record replays with its exact contents."""
    j = Journal(str(mapped_dir))
    pushed = [_push(j, 40, seed=1)]  # the first append of a segment has no prepared space: pwritev
    _wait_mapped(j, _record_bytes(j) + 200_000)
    pushed += [_push(j, n, seed=s) for s, n in ((2, 1), (3, 5000), (4, 7))]
    assert j.mapped_appends == 3
    j._prefault.close()  # a kill -9: the mapping and the descriptor go without the file being cut
    j._map.close()
    os.close(j._fd)
    j2 = Journal(str(mapped_dir))
    replayed = list(j2.replay(0))
    assert [r.seq for r in replayed] == [seq for seq, _ in pushed] == [1, 2, 3, 4]
    for r, (_, (ids, grads, shows, clicks)) in zip(replayed, pushed):
        assert r.ids.tolist() == ids.tolist() and r.grads.tolist() == grads.tolist()
        assert r.shows.tolist() == shows.tolist() and r.clicks.tolist() == clicks.tolist()
    _push(j2, 3, seed=5)
    _wait_mapped(j2, _record_bytes(j2) + 1000)
    _push(j2, 3, seed=6)
    assert j2.mapped_appends == 1
    j2.close()
    assert [r.seq for r in _replayed(str(mapped_dir))] == [1, 2, 3, 4, 5, 6]


def test_a_synced_journal_writes_with_pwritev_only(tmp_path):
    """With sync, each append's fsync would also write the zero pages mapped ahead: no mapping then."""
    j = Journal(str(tmp_path), sync=True)
    _push(j, 3, seed=1)
    _wait_prepared(j._path, _record_bytes(j))  # space is prepared: an unsynced journal would map its next append
    _push(j, 3, seed=2)
    assert j._map is None and j.mapped_appends == 0
    j.close()
    assert [r.seq for r in _replayed(str(tmp_path))] == [1, 2]


def test_a_mapped_append_writes_its_header_first_and_a_failure_takes_it_back(mapped_dir, monkeypatch):
    """The header (checksum still 0) is in place before the payload is copied, so a crash part-way leaves a
    torn record, never payload bytes without a header; a copy that fails is cut off like a failed write."""
    from ps.storage import journal as journal_module

    j = Journal(str(mapped_dir))
    _push(j, 3, seed=1)
    _wait_mapped(j, _record_bytes(j) + 10_000)
    start = _record_bytes(j)
    seen = []

    def copy_then_fail(buffers, skip, dest):
        header = bytes(j._map.array[start : start + journalformat.HEADER.size])
        seen.append(journalformat.HEADER.unpack(header))
        dest[: len(dest) // 2] = 7  # part of the payload is in place ...
        raise MemoryError("copy failed")  # ... when the copy fails

    monkeypatch.setattr(journal_module, "copy_with_checksum64", copy_then_fail)
    with pytest.raises(MemoryError):
        _push(j, 50, seed=2)
    monkeypatch.undo()
    magic, seq, payload_len, crc = seen[0]
    assert (magic, seq, crc) == (journalformat.MAGIC, 2, 0) and payload_len > 50 * 8
    assert os.path.getsize(j._path) == _record_bytes(j) == start  # cut back to record 1
    assert _push(j, 3, seed=3)[0] == 2
    j.close()
    assert [r.seq for r in _replayed(str(mapped_dir))] == [1, 2]


@pytest.mark.parametrize("copied", [0, 0.5, 1.0])  # a crash before, during or after the payload's copy
def test_a_crash_inside_a_mapped_append_leaves_a_torn_record_that_replay_cuts(tmp_path, copied):
    """What a kill -9 inside _copy_into_map leaves: the header with a zero checksum, some or all of the payload,
    then prepared zeros. Replay cuts it off and keeps every record before it."""
    path = _one_segment(tmp_path, (1, 2))
    size = os.path.getsize(path)
    payload = np.random.default_rng(3).integers(1, 256, 5000, dtype=np.uint8).tobytes()
    with open(path, "r+b") as f:
        f.seek(size)
        f.write(journalformat.HEADER.pack(journalformat.MAGIC, 3, len(payload), 0))
        f.write(payload[: int(len(payload) * copied)])
        f.write(bytes(64 << 10))  # prepared zeros
    assert [r.seq for r in Journal(str(tmp_path)).replay(0)] == [1, 2]
    assert os.path.getsize(path) == size


def _mapped_rss(path: str) -> int:
    """Bytes of the process's mappings of path that are resident (in its page tables)."""
    rss, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                rss += int(line.split()[1]) * 1024
    return rss


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc")
def test_mapped_records_are_released_from_the_process_page_tables(mapped_dir, monkeypatch):
    """Pages the journal has copied records into leave the process's RSS (they stay in the page cache): only
    the space prepared ahead stays mapped, not the whole segment written so far."""
    from ps.storage import journal as journal_module

    monkeypatch.setattr(journal_module, "RELEASE_BYTES", 1 << 20)
    j = Journal(str(mapped_dir))
    _push(j, 10, seed=0)
    for seed in range(1, 101):  # 70 MB of records of 700 KB (25,000 ids of 28 bytes)
        _wait_mapped(j, _record_bytes(j) + 800_000)  # room for the whole record: else it is written, not copied
        _push(j, 25_000, seed=seed)
    assert j.mapped_appends == 100
    with j._prefault._lock:  # no prefault step in flight: every page it has populated is below mapped_end
        rss = _mapped_rss(j._path)
        ahead = j._prefault.mapped_end - _record_bytes(j)
    assert rss <= ahead + (1 << 20) + 8192 < _record_bytes(j) // 2, (rss, ahead, _record_bytes(j))
    j.close()
    assert [r.seq for r in _replayed(str(mapped_dir))] == list(range(1, 102))


def test_a_damaged_last_record_the_mark_says_was_written_is_called_damage_not_a_torn_end(tmp_path):
    """A crash tears only a record never acknowledged: past the mark. A last record the mark covers that fails
    its checksum is damage, and the refusal says so (not "missing")."""
    mark_path = str(tmp_path / "journal.mark")
    j = Journal(str(tmp_path / "j"), mark_path=mark_path)
    list(j.replay(0))
    for seed in (1, 2, 3):
        _push(j, 10, seed=seed)
    j.close()
    (path,) = [os.path.join(tmp_path / "j", f) for f in os.listdir(tmp_path / "j")]
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 5)  # inside the last record's clicks
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(JournalCorruptError, match=r"corrupt at byte \d+ .*where record 3 should be: the journal mark"):
        list(Journal(str(tmp_path / "j"), mark_path=mark_path).replay(0))
    accepted = Journal(str(tmp_path / "j"), mark_path=mark_path)
    assert [r.seq for r in accepted.replay(0, accept_loss=True)] == [1, 2]
    assert len(accepted.losses) == 1 and "where record 3 should be" in accepted.losses[0]
    accepted.close()


def test_a_file_size_limit_refuses_the_push_as_a_resource_not_an_internal_error(tmp_path):
    """`ulimit -f` below a segment's size (EFBIG): RESOURCE_EXHAUSTED naming the limit, and the pushes journaled
    before it replay whole (a child process, so that the limit binds no one else)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import resource, numpy as np
        from ps.errors import FileTooLargeError
        from ps.storage.journal import Journal
        j = Journal({str(tmp_path)!r})
        assert list(j.replay(0)) == []  # a journal is replayed before its first append
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
        ids, done = np.arange(1000, dtype="<u8"), 0
        try:
            for k in range(1000):
                j.append("t", ids, np.ones((1000, 16), "<f4"), np.ones(1000, "<f4"), np.zeros(1000, "<f4"), k)
                done += 1
        except FileTooLargeError as e:
            print(done, e.status, e, flush=True)
        """)  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    done, status, message = out.stdout.split(" ", 2)
    assert status == "RESOURCE_EXHAUSTED" and "`ulimit -f`, is 1,048,576 bytes" in message, out.stdout + out.stderr
    assert "nothing was applied" in message and int(done) > 0
    assert len(list(Journal(str(tmp_path)).replay(0))) == int(done)  # each acknowledged record, whole


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def _marked_journal(tmp_path, pushes: int, clicks: float = 0.0) -> tuple[str, str, list[int]]:
    """(journal dir, mark path, each record's offset) after `pushes` records of 10 ids whose clicks are all `clicks`
    (0.0: each record ends in zero bytes, as most CTR pushes do), closed."""
    mark_path, directory = str(tmp_path / "journal.mark"), str(tmp_path / "j")
    j = Journal(directory, mark_path=mark_path)
    list(j.replay(0))
    offsets = []
    for seed in range(pushes):
        offsets.append(j.size_bytes())
        ids = np.arange(10, dtype=np.uint64) + 100 * seed
        j.append("t", ids, np.ones((10, 3), np.float32), np.ones(10, np.float32), np.full(10, clicks, np.float32),
                 step=seed)  # fmt: skip
    j.close()
    return directory, mark_path, offsets


def test_a_damaged_last_record_ending_in_zeros_is_damage_not_a_missing_record(tmp_path):
    """A whole last record the mark covers, whose last bytes are zeros (clicks of 0.0), that fails its checks is
    damage at a byte, not a record cut short; with --accept-journal-loss the cut is not called a push never
    acknowledged."""
    directory, mark_path, offsets = _marked_journal(tmp_path, 3)
    (path,) = Journal(directory).segments()
    _flip(path[1], offsets[2] + 40)  # inside the last record's payload
    with pytest.raises(JournalCorruptError, match=rf"corrupt at byte {offsets[2]} .*where record 3 should be"):
        list(Journal(directory, mark_path=mark_path).replay(0))
    accepted = Journal(directory, mark_path=mark_path)
    assert [r.seq for r in accepted.replay(0, accept_loss=True)] == [1, 2]
    assert len(accepted.losses) == 1 and "where record 3 should be" in accepted.losses[0]
    accepted.close()


@pytest.mark.parametrize("grown_by", [1, 1 << 10, 1 << 30])
def test_a_last_record_whose_length_field_is_damaged_is_damage_not_a_missing_record(tmp_path, grown_by):
    """A flipped bit in the length field of the last record the mark covers can announce more bytes than the
    segment holds, as a record cut short does; but the record is all there (its payload's head says how long it
    is): damage at its byte, not a missing record, at start-up and in verify's check."""
    directory, mark_path, offsets = _marked_journal(tmp_path, 3, clicks=1.0)
    (path,) = Journal(directory).segments()
    with open(path[1], "r+b") as f:
        f.seek(offsets[2] + 12)  # the last record's payload_len
        (length,) = struct.unpack("<I", f.read(4))
        f.seek(offsets[2] + 12)
        f.write(struct.pack("<I", length + grown_by))
    damage = rf"corrupt at byte {offsets[2]} .*where record 3 should be: the journal mark"
    with pytest.raises(JournalCorruptError, match=damage):
        list(Journal(directory, mark_path=mark_path).replay(0))
    count, refused, _cut, _tables = Journal(directory, mark_path=mark_path).check(0)
    assert count == 2 and re.search(damage, refused) and "missing" not in refused, refused
    os.truncate(path[1], offsets[2] + 100)  # the same record cut short: missing, as before
    with pytest.raises(JournalLossError, match=r"journal records 3\.\.3 in .* are missing"):
        list(Journal(directory, mark_path=mark_path).replay(0))


def test_the_cut_of_damage_below_the_mark_is_not_called_a_push_never_acknowledged(tmp_path, caplog):
    directory, mark_path, offsets = _marked_journal(tmp_path, 3, clicks=1.0)
    (path,) = Journal(directory).segments()
    with open(path[1], "r+b") as f:
        f.truncate(offsets[2] + 30)  # the last record cut short: missing, below the mark
    accepted = Journal(directory, mark_path=mark_path)
    with caplog.at_level("WARNING"):
        assert [r.seq for r in accepted.replay(0, accept_loss=True)] == [1, 2]
    accepted.close()
    assert "records 3..3" in accepted.losses[0] and "missing" in accepted.losses[0]
    cut = [r.getMessage() for r in caplog.records if "cut 30 bytes" in r.getMessage()]
    assert len(cut) == 1 and f"journal mark ({mark_path}) says records up to 3 were written" in cut[0]
    assert "never acknowledged" not in cut[0] and "every record up to" not in cut[0]


def test_a_journal_is_marked_when_it_is_first_opened_before_any_record(tmp_path):
    """A server killed within a second of its first push (before the mark's thread wrote) leaves a mark of 0, not
    none: its torn last record is a crash's, cut with a warning, not a deletion refused."""
    mark_path, directory = str(tmp_path / "journal.mark"), str(tmp_path / "j")
    j = Journal(directory, mark_path=mark_path)
    list(j.replay(0))
    assert json.loads(pathlib.Path(mark_path).read_text()) == {"written_seq": 0}
    _push(j, 10, seed=1), _push(j, 10, seed=2)
    j.close()
    pathlib.Path(mark_path).write_text('{"written_seq": 0}')  # as a kill within the first second leaves it
    (segment,) = Journal(directory).segments()
    with open(segment[1], "r+b") as f:
        f.truncate(os.path.getsize(segment[1]) - 5)  # the second record torn
    again = Journal(directory, mark_path=mark_path)
    assert [r.seq for r in again.replay(0)] == [1] and again.losses == []
    again.close()


@pytest.mark.parametrize("cut", ["mid-record", "at a record", "torn first record"])
def test_a_mark_deleted_while_the_journal_holds_records_is_refused_unless_the_loss_is_accepted(tmp_path, cut):
    """The mark and the journal's last records lost before the first flush (RocksDB holds no push): the records
    found show that pushes were written, and the mark that said how many is gone, so start-up refuses rather than
    cut the journal as a crash's torn end."""
    directory, mark_path, offsets = _marked_journal(tmp_path, 3, clicks=1.0)
    os.remove(mark_path)
    (segment,) = Journal(directory).segments()
    with open(segment[1], "r+b") as f:
        f.truncate({"mid-record": offsets[2] + 30, "at a record": offsets[2], "torn first record": 30}[cut])
    held = "the bytes of a record" if cut == "torn first record" else "records up to 2"
    with pytest.raises(JournalLossError, match=rf"journal mark {mark_path} is missing, though the journal \(1 segment "
                                               rf"in .*\) holds {held} .*it was deleted.*Refusing to start"):  # fmt: skip
        list(Journal(directory, mark_path=mark_path).replay(0))
    assert not os.path.exists(mark_path)  # a refusal writes nothing
    accepted = Journal(directory, mark_path=mark_path)
    assert [r.seq for r in accepted.replay(0, accept_loss=True)] == ([] if cut == "torn first record" else [1, 2])
    accepted.close()
    assert len(accepted.losses) == 1 and "is missing, though the journal" in accepted.losses[0]
    assert os.path.exists(mark_path)  # marked again: the next start does not meet the loss again
    after = Journal(directory, mark_path=mark_path)
    list(after.replay(0))
    assert after.losses == []
    after.close()


@pytest.mark.parametrize("pushes", [0, 2])
def test_a_mark_that_does_not_read_is_written_anew_once_its_loss_is_accepted(tmp_path, pushes):
    """A damaged mark refuses the start; --accept-journal-loss starts and writes the mark anew, so the next start
    does not meet the loss again. Also on a shard that never took a push (its tables made, nothing pushed), whose
    mark holds 0 as a new one does."""
    directory, mark_path, _ = _marked_journal(tmp_path, pushes)
    pathlib.Path(mark_path).write_text('{"written_seq": ')  # damaged
    with pytest.raises(JournalLossError, match=r"journal.mark is damaged: .* Refusing to start"):
        list(Journal(directory, mark_path=mark_path).replay(0))
    accepted = Journal(directory, mark_path=mark_path)
    assert [r.seq for r in accepted.replay(0, accept_loss=True)] == list(range(1, pushes + 1))
    accepted.close()
    assert len(accepted.losses) == 1 and "journal.mark is damaged" in accepted.losses[0]
    assert json.loads(pathlib.Path(mark_path).read_text()) == {"written_seq": pushes}
    after = Journal(directory, mark_path=mark_path)
    assert [r.seq for r in after.replay(0)] == list(range(1, pushes + 1)) and after.losses == []
    after.close()


def test_a_journal_with_no_data_and_no_mark_starts_and_is_marked(tmp_path):
    """No mark, no flushed push, no journal data (a dir of a server that never took a push): nothing shows a push
    was written, so there is nothing to refuse."""
    mark_path, directory = str(tmp_path / "journal.mark"), str(tmp_path / "j")
    os.makedirs(directory)
    (pathlib.Path(directory) / f"{1:020d}.log").write_bytes(bytes(4096))  # space prepared ahead, never written
    j = Journal(directory, mark_path=mark_path)
    assert list(j.replay(0)) == [] and j.losses == []
    j.close()
    assert json.loads(pathlib.Path(mark_path).read_text()) == {"written_seq": 0}


def test_accepting_a_damaged_record_applies_the_intact_records_after_it(tmp_path):
    """--accept-journal-loss goes on without the damaged record only: the intact ones after it are replayed, and
    the loss is named as damage, not as missing records."""
    directory, mark_path, offsets = _marked_journal(tmp_path, 5, clicks=1.0)
    (path,) = Journal(directory).segments()
    _flip(path[1], offsets[1] + 40)  # record 2
    with pytest.raises(JournalCorruptError, match=rf"corrupt at byte {offsets[1]} "):
        list(Journal(directory, mark_path=mark_path).replay(0))
    accepted = Journal(directory, mark_path=mark_path)
    assert [r.seq for r in accepted.replay(0, accept_loss=True)] == [1, 3, 4, 5]
    accepted.close()
    assert len(accepted.losses) == 2, accepted.losses
    assert f"corrupt at byte {offsets[1]}" in accepted.losses[0]
    assert f"records 2..2 (1 push, which may have been acknowledged) were in the damaged bytes of {path[1]}" in (
        accepted.losses[1])  # fmt: skip
    assert "missing" not in accepted.losses[1]


def test_a_journal_that_is_a_file_is_refused_and_other_logs_are_not_segments(tmp_path):
    (tmp_path / "j").write_bytes(b"x\n")
    with pytest.raises(JournalCorruptError, match=r"journal .*/j is a file, not the directory of journal segments"):
        list(Journal(str(tmp_path / "j")).replay(0))
    with pytest.raises(JournalCorruptError, match="is a file"):
        list(Journal(str(tmp_path / "j")).replay(0, accept_loss=True))
    other = tmp_path / "k"
    j = Journal(str(other))
    list(j.replay(0))
    _push(j, 10)
    j.close()
    (other / "000004.log").write_bytes(b"RocksDB's write-ahead log, not a journal segment")
    assert [r.seq for r in Journal(str(other)).replay(0)] == [1]


def _vm_rss(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def _vm_hwm() -> int:
    return _vm_rss("VmHWM")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_replay_holds_a_window_of_the_segment_not_the_segment(tmp_path):
    """Replay reads a segment a window at a time: the process's RSS grows by a window or two (READ_BYTES) while it
    reads a 70 MB segment, not by the segment (a segment can be 256 MiB, more than a small --memory-bytes
    leaves)."""
    j = Journal(str(tmp_path), segment_bytes=1 << 30)
    for seed in range(100):  # 70 MB of records of 700 KB (25,000 ids of 28 bytes), one segment
        _push(j, 25_000, seed=seed)
    j.close()
    assert len(os.listdir(tmp_path)) == 1
    before, grown, seqs = _vm_rss(), 0, []
    for rec in Journal(str(tmp_path)).replay(0):
        grown = max(grown, _vm_rss() - before)
        seqs.append(rec.seq)
    assert seqs == list(range(1, 101))
    assert grown < 20 << 20, f"replay grew the RSS by {grown / 2**20:.0f} MiB reading 70 MB"
    (path,) = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    os.truncate(path, os.path.getsize(path) - 1000)  # a crash's torn last record, then space prepared ahead
    with open(path, "ab") as f:
        f.write(bytes(64 << 20))
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM from here: the judging of the torn end is its peak
        f.write("5")
    before = _vm_rss()
    seqs = [rec.seq for rec in Journal(str(tmp_path)).replay(0)]
    grown = _vm_hwm() - before
    assert seqs == list(range(1, 100)) and os.path.getsize(path) < 70_000_000
    assert grown < 20 << 20, f"replay of a torn end grew the RSS by {grown / 2**20:.0f} MiB"


def test_a_segment_cut_while_it_is_read_ends_the_check_without_a_crash(tmp_path, monkeypatch):
    """ps-server verify reads a live server's journal, whose flush cuts the active segment back: a segment cut
    under the reader is read as far as it goes (the records before the cut), never a crash (reads, not a mapping,
    so no SIGBUS), and replay's windows are read where the records are."""
    j = Journal(str(tmp_path), segment_bytes=1 << 30)
    for seed in range(6):
        _push(j, 2000, seed=seed)
    j.close()
    (path,) = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    size = os.path.getsize(path)
    monkeypatch.setattr(journalformat, "READ_BYTES", 4096)  # a window per record
    found = journalformat.SegmentReader.end_of_data

    def cut_after_opening(reader):
        end = found(reader)
        os.truncate(
            path, size // 2 + 100
        )  # inside record 4: the live server's cut, after the reader took the file's size
        return end

    monkeypatch.setattr(journalformat.SegmentReader, "end_of_data", cut_after_opening)
    count, refusal, cut, _tables = Journal(str(tmp_path)).check(0)
    assert 0 < count < 6 and (refusal or cut), (count, refusal, cut)


def test_the_zeros_after_the_last_record_are_not_read_but_cut(tmp_path, monkeypatch):
    """The space prepared ahead of appends (zeros to the end of the newest segment) ends replay without the
    segment being read from there on, and is cut off as before; a bad record still is judged on the segment read
    from it on."""
    j = Journal(str(tmp_path))
    for seed in range(3):
        _push(j, 100, seed=seed)
    j.close()
    (path,) = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    records_end = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(bytes(1 << 20))  # prepared space
    whole_reads = []
    read_from = journalformat.SegmentReader.read_from
    monkeypatch.setattr(
        journalformat.SegmentReader, "read_from", lambda r, pos: whole_reads.append(pos) or read_from(r, pos)
    )
    assert [r.seq for r in _replayed(str(tmp_path))] == [1, 2, 3]
    assert whole_reads == [] and os.path.getsize(path) == records_end
    with open(path, "r+b") as f:  # a flipped byte in the last record: judged on the whole segment, cut as torn
        f.seek(records_end - 3)
        f.write(b"\xff")
    assert [r.seq for r in _replayed(str(tmp_path))] == [1, 2] and len(whole_reads) >= 1
