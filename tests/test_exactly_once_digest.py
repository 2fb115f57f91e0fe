"""A client's newest request is kept with the digest of its content across a restart (ps.engine.pushpath,
ps.storage.applied): its seq sent again with other content is refused after a clean stop and after kill -9 (the
digest read back from the `applied/` keys, the journal's records or the clock advance note), while the same
request sent again is still answered as applied before; and a journal or a store written without digests (the
versions before them) opens, its requests' digests unknown, so any content of such a seq is taken as a retry."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from ps.errors import RequestSeqReusedError
from ps.storage.journalformat import SegmentReader, list_segments
from ps.storage.meta import ADVANCED_PREFIX, APPLIED_PREFIX, APPLIED_VALUE, OLDER_APPLIED_VALUE, client_key
from ps.storage.store import Store
from tests.conftest import crash
from tests.test_exactly_once import A, B, empty_push, open_shard, push, rows
from tests.test_journal_format import PSJ5, encode_record

RESTARTS = ["clean stop", "kill -9", "flush, then kill -9"]
REQUESTS = {  # a client's first request: its pushes (the clock advance is 2)
    "pushes": lambda: [push(A, 1.0), push(B, 1.0)],
    "advance alone": lambda: [],
    "a push without ids": lambda: [empty_push()],
}


def restarted(shard, path, how: str):
    """The shard at path opened again after a stop of the shard given: `how`, one of RESTARTS."""
    if how == "clean stop":
        shard.close()
    else:
        if how.startswith("flush"):
            shard.flush()  # the journal trimmed: the entry is in RocksDB's `applied/` keys
        crash(shard)
    return open_shard(path)


@pytest.mark.parametrize("how", RESTARTS)
@pytest.mark.parametrize("kind", list(REQUESTS))
def test_a_seq_reused_with_other_content_is_refused_after_a_restart_and_a_retry_is_not(tmp_path, how, kind):
    shard = open_shard(tmp_path)
    first = REQUESTS[kind]()
    assert shard.push_batch(first, 2, client=7, client_seq=1) == (2, len(first))
    before = rows(shard, A), rows(shard, B)
    shard = restarted(shard, tmp_path, how)
    try:
        others = [([push(A, 5.0)], 2), (first, 3), ([*first, push(B, 1.0)], 2)]  # other values, advance, pushes
        for pushes, advance in others:
            with pytest.raises(RequestSeqReusedError, match="seq 1 of this client id .* with other content"):
                shard.push_batch(pushes, advance, client=7, client_seq=1)
        assert shard.clock == 2
        np.testing.assert_array_equal(rows(shard, A), before[0])
        np.testing.assert_array_equal(rows(shard, B), before[1])
        assert shard.push_batch(first, 2, client=7, client_seq=1) == (2, 0)  # the same request: applied before
        assert shard.push_batch([push(B, 1.0)], 0, client=7, client_seq=2) == (2, 1)  # the next one is applied
    finally:
        shard.close()


def test_a_retry_that_applies_the_rest_after_kill_9_keeps_the_digest(tmp_path):
    """Push 0 of a request journaled, then kill -9: its retry applies push 1; after a second kill -9, the request's
    seq with other content is refused, the same content answered as applied."""
    shard = open_shard(tmp_path)
    shard.push_batch([push(A, 1.0), push(B, 1.0)], 0, client=7, client_seq=1)
    digest = shard.journal.applied.entry(7).digest
    assert digest
    crash(shard)
    shard = open_shard(tmp_path)
    try:
        assert shard.journal.applied.entry(7)[::3] == (1, digest)  # from the journal's records
        with pytest.raises(RequestSeqReusedError):
            shard.push_batch([push(A, 1.0), push(B, 2.0)], 0, client=7, client_seq=1)
        assert shard.push_batch([push(A, 1.0), push(B, 1.0)], 0, client=7, client_seq=1) == (0, 0)
        assert (rows(shard, A) == -1).all() and (rows(shard, B) == -1).all()
    finally:
        shard.close()


def rewrite_without_digests(journal_dir) -> int:
    """Rewrites every record of the journal's segments as the version before the digest wrote them: the same
    fields, magic PSJ5, the head without the digest, checksummed again. Returns how many records it rewrote."""
    count = 0
    for _, path in list_segments(str(journal_dir)):
        reader, out, pos = SegmentReader(path), [], 0
        reader.end_of_data()
        while True:
            rec, pos = reader.record_at(pos)
            if rec is None:
                break
            arrays = (rec.ids, rec.grads, rec.shows, rec.clicks)  # origin: client, client_seq, part, digest (left out)
            out.append(encode_record(PSJ5, rec.seq, rec.table, rec.step, rec.origin[:3], rec.rule, arrays, None))
            count += 1
        reader.close()
        with open(path, "wb") as f:
            f.write(b"".join(out))
    return count


def test_a_journal_written_without_digests_replays_and_takes_any_content_of_its_seq_as_a_retry(tmp_path):
    shard = open_shard(tmp_path)
    shard.push_batch([push(A, 1.0), push(B, 1.0)], 0, client=7, client_seq=1)
    crash(shard)
    assert rewrite_without_digests(tmp_path / "journal") == 2
    shard = open_shard(tmp_path)
    try:
        assert shard.journal.applied.entry(7)[::3] == (1, 0)  # replayed, its digest unknown
        assert (rows(shard, A) == -1).all() and (rows(shard, B) == -1).all()
        assert shard.push_batch([push(A, 9.0)], 0, client=7, client_seq=1) == (0, 0)  # taken as a retry
        assert shard.push_batch([push(A, 1.0)], 0, client=8, client_seq=1) == (0, 1)  # a new record, with a digest
        assert (rows(shard, A) == -2).all()
        segments = [path for _, path in list_segments(str(tmp_path / "journal"))]  # the PSJ5 one flushed, deleted
        assert [pathlib.Path(path).read_bytes()[:4] for path in segments] == [b"PSJ6"]
    finally:
        crash(shard)
    shard = open_shard(tmp_path)  # the new record, with its digest
    try:
        assert (rows(shard, A) == -2).all()
        with pytest.raises(RequestSeqReusedError):
            shard.push_batch([push(A, 9.0)], 0, client=8, client_seq=1)
    finally:
        shard.close()


def test_a_store_written_without_digests_opens_and_takes_any_content_of_its_seq_as_a_retry(tmp_path):
    shard = open_shard(tmp_path)
    shard.push_batch([push(A, 1.0)], 2, client=7, client_seq=1)
    shard.push_batch([], 3, client=9, client_seq=4)
    shard.close()
    store = Store(str(tmp_path))  # as the versions before the digest stored the entries and the advance notes
    try:
        for client, seq, parts in ((7, 1, 1), (9, 4, 0)):
            key = client_key(APPLIED_PREFIX, client)
            used_s = APPLIED_VALUE.unpack(store._dir.meta_cf.get(key))[2]
            store._dir.meta_cf.put(key, OLDER_APPLIED_VALUE.pack(seq, parts, used_s))
            store._dir.meta_cf.put(client_key(ADVANCED_PREFIX, client), str(seq).encode())
    finally:
        store.close()
    shard = open_shard(tmp_path)
    try:
        assert [shard.journal.applied.entry(c)[::3] for c in (7, 9)] == [(1, 0), (4, 0)]
        assert shard.push_batch([push(A, 9.0)], 2, client=7, client_seq=1) == (5, 0)  # taken as retries
        assert shard.push_batch([push(B, 1.0)], 3, client=9, client_seq=4) == (5, 0)
        assert shard.clock == 5 and (rows(shard, A) == -1).all() and (rows(shard, B) == 0).all()
    finally:
        shard.close()


@pytest.mark.parametrize("how", RESTARTS)
def test_a_request_of_only_pushes_without_ids_and_no_advance_is_kept_until_a_flush(tmp_path, how):
    """Such a request leaves no journal record and no advance note: its `applied/` entry, written at the next flush,
    is all that keeps its seq. After a clean stop or a flush its seq with other content is refused; after kill -9
    before a flush the seq is forgotten, and other content under it is applied as a new request (harmless: the
    first changed nothing, so nothing is applied twice)."""
    shard = open_shard(tmp_path)
    assert shard.push_batch([push(A, 1.0)], 0, client=7, client_seq=1) == (0, 1)
    assert shard.push_batch([empty_push()], 0, client=7, client_seq=2) == (0, 1)
    shard = restarted(shard, tmp_path, how)
    try:
        if how == "kill -9":
            assert shard.journal.applied.get(7) == (1, 1)  # the request before it: the client's newest
            assert shard.push_batch([push(B, 1.0)], 0, client=7, client_seq=2) == (0, 1)
            assert (rows(shard, B) == -1).all()
        else:
            with pytest.raises(RequestSeqReusedError):
                shard.push_batch([push(B, 1.0)], 0, client=7, client_seq=2)
            assert (rows(shard, B) == 0).all()
    finally:
        shard.close()
