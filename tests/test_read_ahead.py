"""A pull's misses are read from RocksDB without the table lock (ps.engine.readahead.ReadAhead): a push goes on
meanwhile, and a row written to RocksDB while the read was out is read again, never served stale."""

from __future__ import annotations

import threading

import numpy as np

from ps.config import TableConfig
from ps.engine.readahead import ReadAhead
from ps.engine.shard import Shard
from ps.server_config import ServerConfig

DIM = 4


def push(shard: Shard, ids: np.ndarray, value: float) -> None:
    n = len(ids)
    shard.push_batch([("t", ids, np.full((n, DIM), value, np.float32), np.ones(n, np.float32),
                       np.zeros(n, np.float32))])  # fmt: skip


def hold_reads_of_thread(shard: Shard, name: str, go_on: threading.Event) -> threading.Event:
    """Makes the store's reads on the thread called `name` hold their answer until go_on is set; returns the event
    set once such a read has its answer."""
    real_get, read_done = shard.store.get_rows, threading.Event()

    def slow_get_rows(*args, **kwargs):
        got = real_get(*args, **kwargs)
        if threading.current_thread().name == name:
            read_done.set()
            assert go_on.wait(20)  # the answer is held while the rows change
        return got

    shard.store.get_rows = slow_get_rows
    return read_done


def rows_after_two_pushes(data_dir: str, ids: np.ndarray) -> np.ndarray:
    """The rows of ids after pushes of 1.0 and then -3.0, on a shard that keeps them all in RAM: the reference."""
    reference = Shard(ServerConfig(data_dir=data_dir))
    try:
        reference.create_table(TableConfig(name="t", dim=DIM))
        push(reference, ids, 1.0)
        push(reference, ids, -3.0)
        return reference.pull("t", ids)
    finally:
        reference.close()


def test_a_row_written_while_the_read_was_out_is_read_again(tmp_path):
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d"), cache_bytes=64 << 10))
    go_on = threading.Event()  # lets the held read go on
    try:
        shard.create_table(TableConfig(name="t", dim=DIM))
        table, hot = shard.table("t"), np.arange(10, dtype=np.uint64)
        cold = np.arange(1000, 3000, dtype=np.uint64)
        push(shard, hot, 1.0)
        shard.pull("t", cold)  # evicts the hot ids: RocksDB has them, RAM does not
        assert (table.arena.find_rows(hot)[0] < 0).all()
        read_done = hold_reads_of_thread(shard, "reader", go_on)
        result = {}
        reader = threading.Thread(target=lambda: result.update(rows=shard.pull("t", hot)), name="reader")
        reader.start()
        assert read_done.wait(20)
        push(shard, hot, -3.0)  # not blocked by the pull's read: the lock is free while it reads
        shard.pull("t", cold)  # and evicted again: the new rows go to RocksDB (written behind)
        assert (table.arena.find_rows(hot)[0] < 0).all()
        go_on.set()
        reader.join(20)
        assert not reader.is_alive()
        assert not table.reads_ahead  # every read ahead unregistered
    finally:
        go_on.set()  # a failure above must not leave the reader blocked
        shard.close()
    np.testing.assert_array_equal(result["rows"], rows_after_two_pushes(str(tmp_path / "ref"), hot))


def test_a_read_ahead_that_ends_first_leaves_the_other_watching(tmp_path):
    """Two reads ahead out at once (each with nothing written yet), the later one done first: a row written after
    that is still read again by the earlier one."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d"), cache_bytes=64 << 10))
    go_on = threading.Event()  # lets the held read go on
    try:
        shard.create_table(TableConfig(name="t", dim=DIM))
        table, hot = shard.table("t"), np.arange(10, dtype=np.uint64)
        cold, other = np.arange(1000, 3000, dtype=np.uint64), np.arange(5000, 5100, dtype=np.uint64)
        push(shard, hot, 1.0)
        push(shard, other, 1.0)
        shard.pull("t", cold)  # evicts both: RocksDB has them, RAM does not
        assert (table.arena.find_rows(np.concatenate([hot, other]))[0] < 0).all()
        read_done = hold_reads_of_thread(shard, "reader", go_on)
        result, errors = {}, []

        def pull_hot():
            try:
                result["rows"] = shard.pull("t", hot)
            except Exception as e:  # the test reports it
                errors.append(e)

        reader = threading.Thread(target=pull_hot, name="reader")
        reader.start()
        assert read_done.wait(20)
        shard.pull("t", other)  # a second read ahead, begun and ended while the first is out
        push(shard, hot, -3.0)
        shard.pull("t", cold)  # the new rows go to RocksDB while the first read is still out
        go_on.set()
        reader.join(20)
        assert not reader.is_alive() and not errors, errors
        assert not table.reads_ahead
    finally:
        go_on.set()  # a failure above must not leave the reader blocked
        shard.close()
    np.testing.assert_array_equal(result["rows"], rows_after_two_pushes(str(tmp_path / "ref"), hot))


def test_reads_ahead_give_what_pulls_under_the_lock_give(tmp_path):
    """Pulls and pushes from two threads over a small RAM tier end with the rows a one-thread run leaves."""
    rng = np.random.default_rng(3)
    calls = [np.unique(rng.integers(0, 3000, 200)).astype(np.uint64) for _ in range(40)]

    def run(data_dir: str, threads: int) -> np.ndarray:
        shard = Shard(ServerConfig(data_dir=data_dir, cache_bytes=64 << 10))
        shard.create_table(TableConfig(name="t", dim=DIM))
        for ids in calls:
            push(shard, ids, 0.5)
        if threads > 1:  # pulls of other ids race the pushes; rows only change by pushes, so the end is the same
            stop = threading.Event()

            def pull_loop():
                while not stop.is_set():
                    shard.pull("t", rng.integers(0, 3000, 300).astype(np.uint64))

            t = threading.Thread(target=pull_loop)
            t.start()
            for ids in calls:
                push(shard, ids, -0.25)
            stop.set()
            t.join()
        else:
            for ids in calls:
                push(shard, ids, -0.25)
        out = shard.pull("t", np.arange(3000, dtype=np.uint64))
        shard.close()
        return out

    np.testing.assert_array_equal(run(str(tmp_path / "a"), 2), run(str(tmp_path / "b"), 1))


def test_a_read_ahead_keeps_only_the_written_ids_it_reads():
    """Rows written while a read is out make it stale only where they are its ids: note_written keeps those, and a
    read whose ids were not written is used as it is (the same arrays, handed over), whatever else was written."""
    ahead = ReadAhead(np.array([3, 5, 9], dtype=np.uint64))
    ahead.note_written(np.array([1, 2, 4, 10], dtype=np.uint64))
    assert ahead.written == []
    stored = (np.ones(3, bool), np.zeros((3, 2), np.float32), np.zeros(3, np.uint64), np.ones(3, bool))
    ahead.stored = stored
    assert ReadAhead.expand(None, "t", ahead.missing, 2, ahead) is stored  # no store read: nothing stale
    assert ahead.stored is None  # the caller's now (it makes its rows in them): a later use reads the store
    ahead.note_written(np.array([10, 9, 1, 3], dtype=np.uint64))
    assert [w.tolist() for w in ahead.written] == [[9, 3]]


def test_a_pull_of_missing_ids_in_any_order_and_repeated_reads_each_row(tmp_path):
    """A pull whose ids miss, in any order and repeated, gets their rows in the request's order, as a pull of the
    same ids sorted and unique gives them afterwards."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d"), cache_bytes=64 << 10))
    try:
        shard.create_table(TableConfig(name="t", dim=DIM))
        table, ids = shard.table("t"), np.arange(500, dtype=np.uint64)
        push(shard, ids, 1.0)
        asked = np.random.default_rng(0).permutation(np.concatenate([ids[::-1], ids[::3]]))
        for k in range(1, 4):  # other ids, each used twice (not on probation): most of ours go
            for _ in range(2):
                shard.pull("t", np.arange(1000 * k, 1000 * k + 1000, dtype=np.uint64))
        assert np.count_nonzero(table.arena.find_rows(asked)[0] < 0) > len(asked) // 2
        got = shard.pull("t", asked)
        expected = shard.pull("t", ids)
    finally:
        shard.close()
    np.testing.assert_array_equal(got, expected[asked.astype(np.int64)])
    assert len(np.unique(expected, axis=0)) == len(ids)  # every row differs: a row given for another id shows


def test_a_pull_whose_table_gives_rows_back_while_its_read_is_out_is_chunked_again(tmp_path):
    """A pull chunked while its table held the whole budget (one chunk: half its rows) reads its misses without
    the lock; meanwhile three other tables take their shares back. The pull is chunked again for what its table
    holds then, and answers (resolved as first chunked, it would find too few rows to evict: RamTierTooSmallError)."""
    from ps.rows.layout import layout_of

    tables = 4
    shard = Shard(ServerConfig(data_dir=str(tmp_path), cache_bytes=tables * 256 * layout_of(DIM, "adagrad").ram_bytes))
    for i in range(tables):
        shard.create_table(TableConfig(name="t" if i == 0 else f"t{i}", dim=DIM))
    mine = shard.table("t")
    n = 0
    while mine.arena.used < mine.arena.max_rows - 10:  # it alone takes the whole budget
        push(shard, np.arange(n, n + 200, dtype=np.uint64), 1.0)
        n += 200
    wanted = np.arange(10**6, 10**6 + mine.arena.max_pinnable(), dtype=np.uint64)  # one chunk, now
    go_on = threading.Event()
    read_done = hold_reads_of_thread(shard, "puller", go_on)
    got: dict = {}
    puller = threading.Thread(target=lambda: got.update(rows=shard.pull("t", wanted)), name="puller")
    puller.start()
    assert read_done.wait(20)
    for i in range(1, tables):  # they take their shares back from t
        ids = np.arange(250, dtype=np.uint64)
        shard.push_batch([(f"t{i}", ids, np.ones((250, DIM), np.float32), np.ones(250, np.float32),
                           np.zeros(250, np.float32))])  # fmt: skip
    assert mine.arena.max_pinnable() < len(wanted)
    go_on.set()
    puller.join(30)
    assert "rows" in got, "the pull failed"
    np.testing.assert_array_equal(got["rows"], shard.pull("t", wanted))
    shard.close()
