"""A push larger than one pass takes is journaled, then applied chunk by chunk: when that fails part way (here a
background write of evicted rows that failed just after the journal append), the shard breaks: it refuses every
request with ShardNeedsRestartError, flushes nothing (the journal keeps the push), tells its listeners (health), and
the next start replays the push whole; a close after a failed flush still lets the data dir go."""

from __future__ import annotations

import numpy as np
import pytest

from ps.config import OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.errors import ShardNeedsRestartError, StorageError
from ps.rows.layout import layout_of
from ps.server_config import ServerConfig

DIM = 8
TIER_ROWS = 256
FILLED = np.arange(800, dtype=np.uint64)  # more than the RAM tier holds: its rows are dirty or on disk
BIG = np.arange(5000, 5400, dtype=np.uint64)  # more than half the tier: applied in chunks


def shard_at(path: str, tier_rows: int) -> Shard:
    return Shard(ServerConfig(data_dir=path, cache_bytes=tier_rows * layout_of(DIM, "sgd").ram_bytes + 1000,
                              flush_interval_s=3600))  # fmt: skip


def push(shard: Shard, ids: np.ndarray, value: float) -> None:
    shard.push("t", ids, np.full((len(ids), DIM), value, np.float32))


def filled(path: str, tier_rows: int) -> Shard:
    shard = shard_at(path, tier_rows)
    shard.create_table(TableConfig(name="t", dim=DIM, optimizer=OptimizerConfig("sgd", 0.1)))
    for lo in range(0, len(FILLED), 100):
        push(shard, FILLED[lo : lo + 100], 1.0)
    return shard


def fail_background_writes_after_journaling(shard: Shard, n: int) -> None:
    """The write-behind fails (as a full disk would) just after a push of n ids is journaled."""
    append = shard.journal.append

    def failing_after(name, ids, *args, **kwargs):
        seq = append(name, ids, *args, **kwargs)
        if len(ids) == n:
            with shard.store._behind._cv:
                shard.store._behind._error = StorageError("simulated: a background RocksDB write failed")
        return seq

    shard.journal.append = failing_after


def test_a_push_failing_part_way_after_its_journal_append_breaks_the_shard_until_a_restart_replays_it(tmp_path):
    reference = filled(str(tmp_path / "reference"), 100_000)
    push(reference, BIG, 0.5)
    want = reference.pull("t", np.concatenate([FILLED, BIG]))
    reference.close()

    shard = filled(str(tmp_path / "small"), TIER_ROWS)
    assert len(list(shard.table("t")._chunks(len(BIG)))) > 1
    told = []
    shard.guard.listeners.append(lambda: told.append(True))
    fail_background_writes_after_journaling(shard, len(BIG))
    with pytest.raises(ShardNeedsRestartError, match=r"is in the journal, but applying it in RAM failed after "
                       r"\d+ of its 400 ids \(StorageError: simulated.*Restart the server"):  # fmt: skip
        push(shard, BIG, 0.5)
    assert told == [True]
    said = shard.guard.lost_unnamed()  # what health's NOT_SERVING says, naming no path (ps.server)
    assert said.startswith("shard 0 takes no writes until a restart: a journaled push was only partly") and \
        str(tmp_path) not in said, said  # fmt: skip
    for refused in (lambda: push(shard, FILLED[:10], 1.0), lambda: shard.pull("t", FILLED[:10]), shard.flush,
                    shard.stats, lambda: shard.hold(5)):  # fmt: skip
        with pytest.raises(ShardNeedsRestartError, match="Restart the server"):
            refused()
    shard.close()  # no flush: the journal keeps the push

    restarted = shard_at(str(tmp_path / "small"), TIER_ROWS)
    np.testing.assert_array_equal(restarted.pull("t", np.concatenate([FILLED, BIG])), want)
    restarted.close()


def test_a_close_whose_flush_fails_still_lets_the_data_dir_go(tmp_path):
    shard = filled(str(tmp_path / "d"), TIER_ROWS)
    with shard.store._behind._cv:
        shard.store._behind._error = StorageError("simulated: a background RocksDB write failed")
    with pytest.raises(StorageError, match="simulated"):
        shard.close()
    reopened = shard_at(str(tmp_path / "d"), TIER_ROWS)  # the journal replays what the flush did not write
    reference = filled(str(tmp_path / "reference"), 100_000)
    np.testing.assert_array_equal(reopened.pull("t", FILLED), reference.pull("t", FILLED))
    reopened.close()
    reference.close()


def test_a_retry_of_a_push_whose_chunk_failed_once_is_refused_and_a_restart_applies_the_push_whole(tmp_path):
    """A RocksDB read that fails once, in a chunk's resolve after the journal append: a retry of the request (same
    client id and seq, which the journal notes as applied) is refused rather than answered as applied, the flush
    leaves the journal alone, and a restart holds the push in every row."""
    reference = filled(str(tmp_path / "reference"), 100_000)
    push(reference, BIG, 0.5)
    want = reference.pull("t", BIG)
    reference.close()

    shard = filled(str(tmp_path / "small"), TIER_ROWS)
    table, append, resolve = shard.table("t"), shard.journal.append, shard.table("t").loader.resolve
    journaled = []

    def noting(name, ids, *args, **kwargs):
        seq = append(name, ids, *args, **kwargs)
        journaled.append(len(ids))
        return seq

    def failing_once_after_the_journal(*args, **kwargs):
        if journaled == [len(BIG)] and not failing_once_after_the_journal.done:
            failing_once_after_the_journal.done = True
            raise StorageError("simulated: a RocksDB read failed")
        return resolve(*args, **kwargs)

    failing_once_after_the_journal.done = False
    shard.journal.append, table.loader.resolve = noting, failing_once_after_the_journal
    request = [("t", BIG, np.full((len(BIG), DIM), 0.5, np.float32), np.ones(len(BIG), np.float32),
                np.zeros(len(BIG), np.float32))]  # fmt: skip
    for _ in range(2):  # the request, then its retry
        with pytest.raises(ShardNeedsRestartError, match=r"\(StorageError: simulated: a RocksDB read failed\)"):
            shard.push_batch(request, client=77, client_seq=1)
    with pytest.raises(ShardNeedsRestartError):
        shard.flush()
    shard.close()
    restarted = shard_at(str(tmp_path / "small"), TIER_ROWS)
    np.testing.assert_array_equal(restarted.pull("t", BIG), want)
    restarted.close()


def test_a_flush_that_marked_the_journal_before_the_push_broke_trims_nothing(tmp_path):
    """A flush takes its journal mark after the push's append and before its failure (then waits for the table's
    lock): it must not record the push as flushed, or the journal's trim would take the push with it."""
    import threading

    reference = filled(str(tmp_path / "reference"), 100_000)
    push(reference, BIG, 0.5)
    want = reference.pull("t", BIG)
    reference.close()

    shard = filled(str(tmp_path / "small"), TIER_ROWS)
    table = shard.table("t")
    append, mark, resolve = shard.journal.append, shard.journal.mark, table.loader.resolve
    journaled, marked, flushed = [], threading.Event(), {}

    def noting(name, ids, *args, **kwargs):
        seq = append(name, ids, *args, **kwargs)
        journaled.append(len(ids))
        return seq

    def marking():
        out = mark()
        marked.set()
        return out

    def flush() -> None:
        try:
            flushed["rows"] = shard.flush()
        except ShardNeedsRestartError as e:
            flushed["refused"] = str(e)

    flusher = threading.Thread(target=flush)

    def failing_once_the_flush_marked(*args, **kwargs):
        if journaled == [len(BIG)] and not flusher.is_alive() and not marked.is_set():
            flusher.start()
            assert marked.wait(20)  # the flush has its mark and waits for the table's lock, which this push holds
            raise StorageError("simulated: a RocksDB read failed")
        return resolve(*args, **kwargs)

    shard.journal.append, shard.journal.mark, table.loader.resolve = noting, marking, failing_once_the_flush_marked
    with pytest.raises(ShardNeedsRestartError):
        push(shard, BIG, 0.5)
    flusher.join(20)
    assert "Restart the server" in flushed.get("refused", ""), flushed
    shard.close()
    restarted = shard_at(str(tmp_path / "small"), TIER_ROWS)
    np.testing.assert_array_equal(restarted.pull("t", BIG), want)
    restarted.close()


def test_a_server_whose_stop_meets_a_broken_shard_says_so_and_exits_1(capsys):
    """A push failing part way while the stop flushes breaks the shard inside close(): the stop says what the next
    start does, with exit 1, not a traceback."""
    from types import SimpleNamespace

    from ps.server_run import stop_server

    def stop():
        raise ShardNeedsRestartError("push 9 to table 't' is in the journal, but ... Restart the server")

    assert stop_server(SimpleNamespace(stop=stop, shard=None), 0) == 1
    err = capsys.readouterr().err
    assert "ps-server shard 0: stopped without writing its last rows to RocksDB (its journal holds" in err, err


def test_a_broken_shards_metrics_say_so_and_still_serve_the_rest(tmp_path):
    """The metrics port of a broken shard answers (a failed scrape would read as the server being down):
    sparseps_shard_broken 1 and the process's figures, not the shard's figures that Stats refuses."""
    from ps.engine.startup import StartProgress
    from ps.metrics import ServerMetrics
    from tests.test_metrics import scrape

    shard = filled(str(tmp_path / "small"), TIER_ROWS)
    metrics = ServerMetrics(StartProgress())
    metrics.attach(shard)
    port = metrics.serve(0, "127.0.0.1")
    try:
        before = scrape(port)
        assert before[("sparseps_shard_broken", ())] == 0 and before[("sparseps_table_rows", (("table", "t"),))] == 800
        fail_background_writes_after_journaling(shard, len(BIG))
        with pytest.raises(ShardNeedsRestartError):
            push(shard, BIG, 0.5)
        after = scrape(port)
        assert after[("sparseps_shard_broken", ())] == 1 and after[("sparseps_data_dir_lost", ())] == 0
        assert after[("process_resident_memory_bytes", ())] > 0 and ("sparseps_starting", ()) in after
        assert not [k for k in after if k[0].startswith("sparseps_table") or k[0] == "sparseps_clock"], sorted(after)
    finally:
        metrics.close()
        shard.close()
