"""The journal's two record shapes (ps.storage.journalformat's grammar): a PSJ5 record, as the version before the
digest wrote it, replays with its digest unknown, and a journal of them goes on in PSJ6 segments; the magic, not
the length, says which shape a record has; a flipped bit of a magic is damage; a record of either shape cut at any
length is a torn end, never read as a record of the other shape."""

from __future__ import annotations

import os
import pathlib
import struct

import numpy as np
import pytest

from ps.storage.checksum import checksum64
from ps.storage.journal import Journal
from ps.storage.journalformat import JournalCorruptError, holds_a_whole_record, segment_path

# the journal's record layout, by hand (ps.storage.journalformat's grammar): magic "PSJ5" (the version before the
# digest) ends the head in the rule, "PSJ6" in the digest; tests/test_exactly_once_digest.py writes PSJ5 journals
PSJ5 = 0x354A5350
PSJ6 = 0x364A5350
HEADER = struct.Struct("<IQIQ")  # magic, seq, payload_len, checksum
CHECKED = struct.Struct("<IQI")  # magic, seq, payload_len: the header's part the checksum covers
HEAD = struct.Struct("<IIQQQIB")  # n, dim, step, client, client_seq, part, rule (after the table name)
DIGEST = struct.Struct("<Q")  # a PSJ6 head's last field


def encode_record(
    magic: int,
    seq: int,
    table: str,
    step: int,
    origin: tuple[int, int, int],
    rule: int,
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    digest: int | None,
) -> bytes:
    """One record's bytes, built by hand from the grammar: the header, then the payload: the table's name, HEAD
    (origin: client, client_seq, part), the digest where one is given, and arrays (ids, grads, shows, clicks)."""
    name = table.encode()
    n, dim = arrays[1].shape
    head = struct.pack("<H", len(name)) + name + HEAD.pack(n, dim, step, *origin, rule)
    if digest is not None:
        head += DIGEST.pack(digest)
    data = [np.ascontiguousarray(a).tobytes() for a in arrays]
    payload_len = len(head) + sum(map(len, data))
    check = checksum64([CHECKED.pack(magic, seq, payload_len), head, *data])
    return HEADER.pack(magic, seq, payload_len, check) + head + b"".join(data)


def record(magic: int, seq: int, origin=(7, 1, 0), digest: int = 0, with_digest: bool | None = None) -> bytes:
    """The bytes of a record of a push of 3 ids of grads of 2 floats to table "t" at step 10 + seq: its head ends
    in the digest where with_digest says (None: where the magic says, PSJ6)."""
    rng = np.random.default_rng(seq)
    n, dim = 3, 2
    # shows and clicks 1.0: the record's last byte is not 0, so a cut record followed by zeros is not whole again
    arrays = (rng.integers(1, 2**64 - 1, n, dtype="<u8"), rng.standard_normal((n, dim)).astype("<f4"),
              np.ones(n, "<f4"), np.ones(n, "<f4"))  # fmt: skip
    with_digest = (magic == PSJ6) if with_digest is None else with_digest
    return encode_record(magic, seq, "t", 10 + seq, origin, 0, arrays, digest if with_digest else None)


def _write(directory, first_seq: int, data: bytes) -> str:
    os.makedirs(directory, exist_ok=True)
    path = segment_path(str(directory), first_seq)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _replayed(directory) -> list:
    return [(r.seq, r.origin, r.step) for r in Journal(str(directory)).replay(0)]


def test_a_psj5_journal_replays_with_digests_unknown_and_goes_on_in_psj6_segments(tmp_path):
    _write(tmp_path, 1, record(PSJ5, 1, origin=(7, 1, 0)) + record(PSJ5, 2, origin=(7, 1, 1)))
    j = Journal(str(tmp_path))
    assert [(r.seq, r.origin, r.step, r.grads.shape) for r in j.replay(0)] == [
        (1, (7, 1, 0, 0), 11, (3, 2)),
        (2, (7, 1, 1, 0), 12, (3, 2)),
    ]
    assert j.applied.entry(7)[::3] == (1, 0)  # the request, its digest unknown
    ids, grads = np.arange(2, dtype=np.uint64), np.ones((2, 4), np.float32)
    assert j.append("t", ids, grads, np.ones(2, np.float32), np.ones(2, np.float32), 5, (8, 1, 0, 99)) == 3
    j.close()
    segments = sorted(os.listdir(tmp_path))
    assert [(tmp_path / s).read_bytes()[:4] for s in segments] == [b"PSJ5", b"PSJ6"]  # a new segment, PSJ6 only
    assert _replayed(tmp_path) == [(1, (7, 1, 0, 0), 11), (2, (7, 1, 1, 0), 12), (3, (8, 1, 0, 99), 5)]


@pytest.mark.parametrize("magic", [PSJ6, PSJ5], ids=["PSJ6", "PSJ5"])
def test_the_magic_not_the_length_says_whether_a_head_holds_a_digest(tmp_path, magic):
    """A record of one magic with the other shape's head, checksummed as it stands, between two records, is
    damage: not read by its length as the shape its bytes would fit."""
    other_shape = record(magic, 2, with_digest=magic != PSJ6, digest=12345)
    data = record(magic, 1) + other_shape + record(magic, 3)
    path = _write(tmp_path, 1, data)
    with pytest.raises(JournalCorruptError, match=f"corrupt at byte {len(record(magic, 1))} "):
        _replayed(tmp_path)
    assert pathlib.Path(path).read_bytes() == data  # nothing cut
    assert [r.seq for r in Journal(str(tmp_path)).replay(0, accept_loss=True)] == [1, 3]


@pytest.mark.parametrize("magic", [PSJ6, PSJ5], ids=["PSJ6", "PSJ5"])
@pytest.mark.parametrize("which", ["first", "last", "only"])
def test_a_flipped_bit_of_a_records_magic_is_damage(tmp_path, magic, which):
    """Each of the 32 bits of a record's magic flipped (PSJ6 to PSJ4, PSJ2 or PSJ7; PSJ5 to PSJ4, ...): refused as
    damage, never cut as a torn end or refused as an older format, the segment left as it is."""
    records = [record(magic, seq) for seq in ((1,) if which == "only" else (1, 2))]
    at = len(records[0]) if which == "last" else 0
    whole = b"".join(records)
    for bit in range(32):
        damaged = bytearray(whole)
        damaged[at + bit // 8] ^= 1 << (bit % 8)
        path = _write(tmp_path / str(bit), 1, bytes(damaged))
        with pytest.raises(JournalCorruptError, match=f"corrupt at byte {at} ") as refused:
            _replayed(tmp_path / str(bit))
        assert "older journal format" not in str(refused.value)
        assert pathlib.Path(path).read_bytes() == bytes(damaged)


@pytest.mark.parametrize("magic", [PSJ6, PSJ5], ids=["PSJ6", "PSJ5"])
@pytest.mark.parametrize("zeros", [0, 4096])  # nothing after the cut, or space prepared ahead
def test_a_record_of_either_shape_cut_at_any_length_is_a_torn_end(tmp_path, magic, zeros):
    """The second record cut after each of its bytes (then zeros, or nothing): replay yields the first record only
    and cuts the rest off; the cut record is never whole, nor read with the other shape's head."""
    first, second = record(magic, 1), record(magic, 2)
    for cut in range(1, len(second)):
        data = first + second[:cut]
        assert not holds_a_whole_record(data, len(first), len(data)), cut
        directory = tmp_path / str(cut)
        path = _write(directory, 1, data + bytes(zeros))
        assert [r.seq for r in Journal(str(directory)).replay(0)] == [1], cut
        assert pathlib.Path(path).read_bytes() == first, cut
    assert holds_a_whole_record(first + second, len(first), len(first) + len(second))
