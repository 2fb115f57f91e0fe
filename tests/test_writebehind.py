"""The write-behind of evicted rows (ps.storage.writebehind, Store.put_rows(background=True)): readers see a
pending batch before RocksDB has it, batches land in order, the pending bytes are bounded, a failed write is
raised (never reported written) and its rows stay visible; a table whose writer is slow still reads its own
evicted rows back exactly. Background writes wait for a moment without requests (ps.storage.foreground), for a
bounded time and not at all when urgent, and a shard marks its pulls and pushes as requests."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ps.config import TableConfig
from ps.engine.shard import Shard
from ps.errors import StorageError
from ps.server_config import ServerConfig
from ps.storage.foreground import Foreground
from ps.storage.options import multi_get
from ps.storage.rowformat import encode_keys
from ps.storage.store import Store
from ps.storage.writebehind import PendingBatch, WriteBehind

WIDTH = 8


def batch(table: str, ids, value: float) -> PendingBatch:
    ids = np.asarray(ids, dtype=np.uint64)
    rows = np.full((len(ids), WIDTH), value, dtype=np.float32)
    return PendingBatch(table, ids, rows, np.full(len(ids), int(value), np.uint64), np.ones(len(ids), bool), {})


class Gate:
    """A writer that records what it wrote and waits for open() before each write (or fails when told)."""

    def __init__(self):
        self.opened, self.written, self.fail = threading.Event(), [], None

    def __call__(self, b: PendingBatch) -> None:
        assert self.opened.wait(10)
        if self.fail is not None:
            raise self.fail
        self.written.append(b)


def test_pending_batches_are_visible_until_written_in_order_then_drained():
    gate = Gate()
    wb = WriteBehind(gate, max_pending_bytes=1 << 20)
    first, second, other = batch("t", [5, 1, 9], 1.0), batch("t", [9, 2], 2.0), batch("u", [5], 3.0)
    for b in (first, second, other):
        wb.submit(b)
    assert wb.snapshot("t") == [first, second] and wb.snapshot("u") == [other]
    assert wb.pending_bytes == sum(b.nbytes for b in (first, second, other))
    hit, at = first.find(np.array([9, 3, 5], dtype=np.uint64))
    assert hit.tolist() == [True, False, True] and first.ids[at].tolist() == [9, 5]
    gate.opened.set()
    wb.drain()
    assert gate.written == [first, second, other] and wb.snapshot("t") == [] and wb.pending_bytes == 0
    wb.close()


def test_submit_waits_while_the_pending_bytes_are_over_the_bound():
    gate = Gate()
    one = batch("t", range(10), 1.0)
    wb = WriteBehind(gate, max_pending_bytes=one.nbytes)
    wb.submit(one)  # one batch is always taken, even alone over the bound
    done = threading.Event()
    threading.Thread(target=lambda: (wb.submit(batch("t", range(10), 2.0)), done.set()), daemon=True).start()
    assert not done.wait(0.3), "a second batch over the bound was taken before the first was written"
    gate.opened.set()
    assert done.wait(10)
    wb.close()
    assert [float(b.rows[0, 0]) for b in gate.written] == [1.0, 2.0]


def test_a_failed_write_is_raised_and_its_rows_stay_visible():
    gate = Gate()
    gate.fail = StorageError("disk full")
    wb = WriteBehind(gate, max_pending_bytes=1 << 20)
    b = batch("t", [1, 2], 1.0)
    wb.submit(b)
    gate.opened.set()
    with pytest.raises(StorageError, match="disk full"):
        wb.drain()
    with pytest.raises(StorageError, match="disk full"):
        wb.submit(batch("t", [3], 2.0))
    assert wb.snapshot("t") == [b] and gate.written == []
    wb.close()


def test_store_reads_pending_rows_before_rocksdb_has_them_and_the_newest_wins(tmp_path):
    store = Store(str(tmp_path / "db"))
    store.create_table(TableConfig(name="t", dim=2))
    width = 2 + 2 + 4  # embedding, adagrad state, statistics
    real_write, gate = store._behind._write, Gate()

    def gated(b: PendingBatch) -> None:
        gate(b)
        real_write(b)

    store._behind._write = gated
    ids = np.array([7, 3], dtype=np.uint64)
    rows1 = np.arange(2 * width, dtype=np.float32).reshape(2, width)
    rows2 = rows1 + 100
    complete = np.array([True, False])  # id 3 is not admitted: only its statistics are kept
    store.put_rows("t", ids, rows1, np.array([1, 1], np.uint64), complete, {"admitted": 1, "pending": 1},
                   background=True)  # fmt: skip
    store.put_rows("t", ids[:1], rows2[:1], np.array([2], np.uint64), complete[:1], {"admitted": 1, "pending": 1},
                   background=True)  # fmt: skip
    query = np.array([3, 7, 11], dtype=np.uint64)
    found, rows, lsn, got_complete = store.get_rows("t", query, width)
    assert found.tolist() == [True, True, False] and lsn.tolist() == [1, 2] and got_complete.tolist() == [False, True]
    expected_3 = np.zeros(width, np.float32)
    expected_3[-4:] = rows1[1, -4:]
    np.testing.assert_array_equal(rows, np.stack([expected_3, rows2[0]]))
    keys = encode_keys(store.table_number("t"), query)
    assert multi_get(store._rows(), keys) == [None, None, None]  # RocksDB: not yet
    gate.opened.set()
    store.drain()
    assert store.write_behind_bytes == 0
    found2, rows_after, lsn_after, complete_after = store.get_rows("t", query, width)
    assert found2.tolist() == found.tolist() and lsn_after.tolist() == [1, 2]
    np.testing.assert_array_equal(rows_after, rows)  # what RocksDB holds is what the overlay showed
    assert complete_after.tolist() == [False, True]
    store.close()


def test_a_table_with_a_slow_writer_reads_its_evicted_rows_back_exactly(tmp_path):
    """A RAM tier of a few hundred rows, pushes over 4,000 ids: every push evicts dirty rows to a writer that
    lags; the rows pulled afterwards are what an in-RAM table holds for the same pushes."""
    rng = np.random.default_rng(0)
    calls = [np.unique(rng.integers(0, 4000, 300)).astype(np.uint64) for _ in range(30)]
    grads = [rng.standard_normal((len(c), 4)).astype(np.float32) for c in calls]

    def train(data_dir: str, cache_bytes: int, slow: bool) -> np.ndarray:
        shard = Shard(ServerConfig(data_dir=data_dir, cache_bytes=cache_bytes))
        shard.create_table(TableConfig(name="t", dim=4))
        if slow:
            write = shard.store._behind._write
            shard.store._behind._write = lambda b: (threading.Event().wait(0.02), write(b))
        for ids, g in zip(calls, grads):
            ones = np.ones(len(ids), np.float32)
            shard.push_batch([("t", ids, g, ones, np.zeros(len(ids), np.float32))])
        if slow:
            evictions = shard.table("t").arena.evictions
            assert evictions > 1000, evictions
        out = shard.pull("t", np.arange(4000, dtype=np.uint64))
        shard.close()
        return out

    small = train(str(tmp_path / "small"), 64 << 10, slow=True)
    big = train(str(tmp_path / "big"), 64 << 20, slow=False)
    np.testing.assert_array_equal(small, big)


def test_one_eviction_of_more_dirty_rows_than_the_bound_holds_waits_in_parts(tmp_path):
    """A push that evicts many times more dirty rows than the write-behind's bound holds hands them over in parts
    of at most the bound: the pending bytes never exceed it, and the evicted rows read back as they were."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path), cache_bytes=256 << 10))
    shard.create_table(TableConfig(name="t", dim=4))
    table, behind = shard.table("t"), shard.store._behind
    behind.max_pending_bytes = 50 * PendingBatch.row_bytes(table.width)
    handed, submit = [], behind.submit

    def watched(b: PendingBatch) -> None:
        submit(b)
        handed.append((b.nbytes, behind.pending_bytes))

    behind.submit = watched
    n = table.arena.max_pinnable()
    first, ones = np.arange(n, dtype=np.uint64), np.ones(n, np.float32)
    shard.push_batch([("t", first, np.full((n, 4), 0.5, np.float32), ones, 0 * ones)])
    before = shard.pull("t", first)
    for k in (1, 2, 3):  # the RAM tier holds 2n rows: the third push evicts dirty rows
        shard.push_batch([("t", first + np.uint64(k * n), np.full((n, 4), -0.5, np.float32), ones, 0 * ones)])
    evicted = sum(nbytes for nbytes, _ in handed) // PendingBatch.row_bytes(table.width)
    assert evicted >= n and len(handed) >= evicted // 50, (n, evicted, len(handed))
    assert max(pending for _, pending in handed) <= behind.max_pending_bytes
    np.testing.assert_array_equal(shard.pull("t", first), before)
    shard.close()


class Recorder:
    """A writer that records each batch with the number of requests in progress when its write began."""

    def __init__(self, foreground: Foreground):
        self.foreground, self.written = foreground, []

    def __call__(self, b: PendingBatch) -> None:
        self.written.append((b, self.foreground.active))


def test_a_batch_waits_for_the_request_in_progress_then_is_written():
    fg = Foreground(limit_s=30)
    rec = Recorder(fg)
    wb = WriteBehind(rec, max_pending_bytes=1 << 20, foreground=fg)
    with fg.serving():
        wb.submit(batch("t", [1, 2], 1.0))
        threading.Event().wait(0.2)
        assert rec.written == [] and wb.pending_bytes > 0, "written while a request was in progress"
    wb.drain()
    assert [active for _, active in rec.written] == [0]
    wb.close()


def test_a_request_that_never_ends_delays_a_write_by_the_limit_only():
    fg = Foreground(limit_s=0.1)
    rec = Recorder(fg)
    wb = WriteBehind(rec, max_pending_bytes=1 << 20, foreground=fg)
    with fg.serving():
        t = time.monotonic()
        wb.submit(batch("t", [1], 1.0))
        while not rec.written and time.monotonic() - t < 10:
            threading.Event().wait(0.01)
        waited = time.monotonic() - t
        assert [active for _, active in rec.written] == [1] and waited >= 0.09, waited  # the limit, then written
    wb.close()


@pytest.mark.parametrize("how", ["drain", "submit over the bound", "pending over half the bound"])
def test_an_urgent_write_does_not_wait_for_the_request_in_progress(how):
    """A request that itself drains the writer or waits for room (a flush's write, an eviction of many rows) is
    not kept waiting for its own end; nor is a writer whose pending bytes are over half the bound."""
    fg = Foreground(limit_s=30)
    rec = Recorder(fg)
    one = batch("t", range(10), 1.0)
    wb = WriteBehind(rec, max_pending_bytes=3 * one.nbytes // 2 if how != "drain" else 1 << 20, foreground=fg)
    t = time.monotonic()
    with fg.serving():
        wb.submit(one)
        if how == "drain":
            wb.drain()
        elif how == "submit over the bound":
            wb.submit(batch("t", range(10), 2.0))  # waits for room: the first batch must be written
        else:  # 10 of the bound's 15 rows are pending
            while not rec.written and time.monotonic() - t < 10:
                threading.Event().wait(0.01)
        assert rec.written and rec.written[0][1] == 1
    assert time.monotonic() - t < 10
    wb.close()


def test_a_shard_marks_its_pulls_and_pushes_and_its_background_flush_waits_for_them(tmp_path):
    shard = Shard(ServerConfig(data_dir=str(tmp_path), flush_interval_s=3600))
    table = shard.create_table(TableConfig(name="t", dim=4))
    store, seen = shard.store, []
    read, push = store.get_rows, table.push
    store.get_rows = lambda *a, **k: (seen.append(("read", store.foreground.active)), read(*a, **k))[1]
    table.push = lambda *a: (seen.append(("push", store.foreground.active)), push(*a))[1]
    ids = np.arange(5, dtype=np.uint64)
    shard.pull("t", ids)  # misses: read from RocksDB
    shard.push("t", ids, np.ones((5, 4), np.float32))
    assert seen == [("read", 1), ("push", 1)] and store.foreground.active == 0
    store.foreground.limit_s = 30
    entered, leave, flushed = threading.Event(), threading.Event(), []

    def request() -> None:
        with store.foreground.serving():
            entered.set()
            leave.wait(10)

    threading.Thread(target=request, daemon=True).start()
    assert entered.wait(10)
    flusher = threading.Thread(target=lambda: flushed.append(shard.flush(background=True)), daemon=True)
    flusher.start()
    flusher.join(0.3)
    assert flushed == [], "the background flush wrote while a request was in progress"
    leave.set()
    flusher.join(10)
    assert flushed == [5]
    entered.clear()
    leave.clear()
    threading.Thread(target=request, daemon=True).start()
    assert entered.wait(10)
    t = time.monotonic()
    assert shard.flush(background=True) == 0 and time.monotonic() - t < 5  # nothing dirty: nothing to wait for
    shard.push("t", ids, np.ones((5, 4), np.float32))
    flusher = threading.Thread(target=lambda: flushed.append(shard.flush(background=True)), daemon=True)
    flusher.start()
    flusher.join(0.3)
    assert flushed == [5], "the background flush wrote while a request was in progress"
    t = time.monotonic()
    assert shard.flush() == 0 and time.monotonic() - t < 5  # it waited for the flusher, which then went on
    flusher.join(10)
    assert flushed == [5, 5]  # the flusher wrote them, the request still in progress
    leave.set()
    shard.close()
