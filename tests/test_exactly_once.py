"""A push request is applied exactly once however often it is sent: across retries, crashes between two of its
pushes or inside a flush, and flushes that trim the journal (ps.engine.pushpath.PushPath.push_batch, ps.storage.journal
`applied`); and the Client sends a request again when a shard is unavailable."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.push import TablePush
from ps.engine.shard import Shard
from ps.errors import InvalidArgumentError, ShardClosingError
from ps.rows.layout import LAST_STEP
from ps.server_config import ServerConfig
from ps.storage.store import Store
from tests.conftest import FLUSH_CRASH_POINTS, crash, random_ids
from worker.client import Client

SUM = TableConfig("sum", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0))  # row = -(sum of grads)
A, B = random_ids(20, seed=1), random_ids(30, seed=2)


def push(ids, value: float) -> TablePush:
    return TablePush(name="sum", ids=ids, grads=np.full((len(ids), 2), value, np.float32))


def open_shard(path) -> Shard:
    shard = Shard(ServerConfig(data_dir=str(path)))
    shard.create_table(SUM)
    return shard


def rows(shard, ids) -> np.ndarray:
    return shard.pull("sum", ids)[:, 0]


def test_a_request_sent_again_is_applied_once_and_an_older_one_not_at_all(tmp_path):
    shard = open_shard(tmp_path)
    try:
        assert shard.push_batch([push(A, 1.0), push(B, 2.0)], 1, client=7, client_seq=1) == (1, 2)
        assert shard.push_batch([push(A, 1.0), push(B, 2.0)], 1, client=7, client_seq=1) == (1, 0)  # a retry
        assert (rows(shard, A) == -1).all() and (rows(shard, B) == -2).all() and shard.clock == 1
        shard.push_batch([push(A, 1.0)], 0, client=7, client_seq=2)
        shard.push_batch([push(A, 1.0)], 0, client=7, client_seq=1)  # late and old: nothing
        shard.push_batch([push(A, 1.0)], 0, client=8, client_seq=1)  # another client's first request
        assert (rows(shard, A) == -3).all()
        with pytest.raises(InvalidArgumentError, match="non-finite"):  # a bad request is still refused as one
            shard.push_batch([push(A, np.nan)], 0, client=7, client_seq=2)
    finally:
        shard.close()


def test_a_retry_after_a_crash_between_two_pushes_applies_only_the_rest(tmp_path):
    shard = open_shard(tmp_path)
    shard.apply_push(shard.check_push(push(A, 1.0)), origin=(7, 1, 0, 0))  # push 0 of request 1, then kill -9
    crash(shard)
    shard = open_shard(tmp_path)  # replays the journal: request 1 of client 7 has 1 push applied
    try:
        assert shard.journal.applied[7] == (1, 1)
        assert shard.push_batch([push(A, 1.0), push(B, 2.0)], 0, client=7, client_seq=1)[1] == 1
        assert (rows(shard, A) == -1).all() and (rows(shard, B) == -2).all()
    finally:
        shard.close()


def empty_push() -> tuple:
    return ("sum", np.zeros(0, np.uint64), np.zeros((0, 2), np.float32), None, None)


@pytest.mark.parametrize(
    "pushes",
    [[], [empty_push()], [empty_push(), empty_push()], [push(A, 1.0), empty_push(), empty_push()]],
    ids=["advance alone", "a push without ids", "pushes without ids", "a push, then pushes without ids"],
)
def test_a_clock_advance_is_applied_once_across_retries_and_a_crash(tmp_path, pushes):
    """No journal record notes the pushes without ids; the note that a request advanced the clock is stored with
    the clock, so neither a retry nor a retry after kill -9 (before any flush) advances it again, and both are
    answered as a request applied before: no push applied now."""
    shard = open_shard(tmp_path)
    assert shard.push_batch(pushes, 4, client=9, client_seq=1) == (4, len(pushes))
    assert shard.push_batch(pushes, 4, client=9, client_seq=1) == (4, 0)  # a retry
    crash(shard)
    shard = open_shard(tmp_path)
    try:
        assert shard.clock == 4
        assert shard.push_batch(pushes, 4, client=9, client_seq=1) == (4, 0)  # a retry after the restart
        pushed_a = any(len(p[1]) for p in pushes)  # once, by the first attempt (replayed from the journal)
        assert shard.clock == 4 and (rows(shard, A) == (-1.0 if pushed_a else 0.0)).all()
        assert shard.push_batch(pushes, 4, client=9, client_seq=2)[0] == 8  # the next request
        with pytest.raises(InvalidArgumentError, match="ahead of this client's newest request"):
            shard.push_batch(pushes, 4, client=9, client_seq=3 + 2**20)
    finally:
        shard.close()


def test_a_replayed_push_is_not_counted_again_as_admitted_since_the_start(tmp_path):
    """Stats' admitted counts the ids this run admitted: the journal's replay restores rows the run before
    admitted (and counted), so the restarted shard counts only the ids admitted after its start."""
    shard = open_shard(tmp_path)
    shard.push_batch([push(A, 1.0)], 0, client=7, client_seq=1)
    assert shard.table("sum").stats()["admitted"] == len(A)
    crash(shard)
    shard = open_shard(tmp_path)  # replays the push of A
    try:
        table = shard.table("sum")
        assert table.stats()["admitted"] == 0 and table.num_rows == len(A) and (rows(shard, A) == -1).all()
        assert shard.push_batch([push(A, 1.0)], 0, client=7, client_seq=1) == (0, 0)  # a retry: applied before
        shard.push_batch([push(A, 1.0), push(B, 1.0)], 0, client=7, client_seq=2)
        assert table.stats()["admitted"] == len(B) and table.num_rows == len(A) + len(B)
    finally:
        shard.close()


def test_a_clock_advance_that_failed_after_its_pushes_is_applied_by_the_retry(tmp_path, monkeypatch):
    """The pushes are journaled, then storing the clock fails: the retry applies no push again and advances the
    clock once; so does a retry after a crash at that point."""
    shard = open_shard(tmp_path)

    def disk_gone(step, advanced_by=None):
        raise OSError("disk gone")

    monkeypatch.setattr(shard.store.meta, "set_clock", disk_gone)
    with pytest.raises(OSError):
        shard.push_batch([push(A, 1.0)], 3, client=5, client_seq=1)
    monkeypatch.undo()
    assert shard.clock == 0 and (rows(shard, A) == -1).all()
    assert shard.push_batch([push(A, 1.0)], 3, client=5, client_seq=1) == (3, 0)
    assert shard.push_batch([push(A, 1.0)], 3, client=5, client_seq=1) == (3, 0)
    assert (rows(shard, A) == -1).all()

    shard.apply_push(shard.check_push(push(B, 1.0)), origin=(5, 2, 0, 0))  # request 2's push, then kill -9
    crash(shard)
    shard = open_shard(tmp_path)
    try:
        assert shard.clock == 3 and shard.journal.applied[5] == (2, 1)
        assert shard.push_batch([push(B, 1.0)], 3, client=5, client_seq=2) == (6, 0)
        assert shard.push_batch([push(B, 1.0)], 3, client=5, client_seq=2) == (6, 0)
        assert (rows(shard, B) == -1).all()
    finally:
        shard.close()


def test_a_batch_push_refused_while_applied_says_what_stays_applied(tmp_path):
    shard = open_shard(tmp_path)
    try:
        shard.push_batch([push(A[:1], -3e38)], 0)
        with pytest.raises(InvalidArgumentError) as e:
            shard.push_batch([push(B, 1.0), push(A[:1], -3e38)], 2, client=6, client_seq=1)
        message = str(e.value)
        assert "push 1 of 2 in the batch (table 'sum') was refused: " in message
        assert "float32 overflow" in message and "nothing was applied" not in message
        assert "The push 0 before it was applied and stays applied, and the clock was not advanced" in message
        assert "a retry of this request (same client_id and seq) applies pushes 1 on" in message
        assert (rows(shard, B) == -1).all() and shard.clock == 0
    finally:
        shard.close()


@pytest.mark.parametrize("stop", [crash, Shard.close])
def test_what_was_applied_survives_a_flush_that_trims_the_journal(tmp_path, stop):
    shard = open_shard(tmp_path)
    shard.push_batch([push(A, 1.0)], 0, client=7, client_seq=1)
    shard.push_batch([push(A, 1.0)], 0, client=9, client_seq=4)
    shard.flush()  # rows in RocksDB, journal trimmed: `applied` must come from RocksDB now
    assert shard.journal.size_bytes() == 0
    stop(shard)
    shard = open_shard(tmp_path)
    try:
        assert shard.journal.applied == {7: (1, 1), 9: (4, 1)}
        shard.push_batch([push(A, 1.0)], 0, client=7, client_seq=1)
        shard.push_batch([push(A, 1.0)], 0, client=9, client_seq=4)
        assert (rows(shard, A) == -2).all()
    finally:
        shard.close()


OTHER = TableConfig("other", 3, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0))
POOL = random_ids(400, seed=4)


@pytest.mark.parametrize("point", FLUSH_CRASH_POINTS)
def test_a_crash_inside_a_flush_loses_no_acknowledged_push_and_applies_none_twice(tmp_path, point):
    """kill -9 between a flush's RocksDB writes and its journal trim (tests.conftest.crash): after the restart
    the rows equal a numpy oracle of every acknowledged push, those acknowledged while the flush ran included,
    and the last request sent again applies nothing."""
    shard = open_shard(tmp_path)
    shard.create_table(OTHER)
    rng = np.random.default_rng(5)
    want = {"sum": np.zeros((len(POOL), 2), np.float32), "other": np.zeros((len(POOL), 3), np.float32)}
    sent = []

    def request(seq: int) -> None:  # a push to each table; integer gradients: the float32 sums are exact
        pushes = []
        for name, expected in want.items():
            pick = rng.choice(len(POOL), 150, replace=False)
            grads = rng.integers(-3, 4, (150, expected.shape[1])).astype(np.float32)
            pushes.append((name, POOL[pick], grads, None, None))
            expected[pick] -= grads  # SGD, lr 1
        assert shard.push_batch(pushes, 0, client=7, client_seq=seq)[1] == 2
        sent.append(pushes)

    for seq in (1, 2, 3):
        request(seq)
    shard.flush()  # RocksDB holds these rows, the journal is trimmed
    flushed = shard.store.meta.flushed_seq()
    for seq in (4, 5, 6):  # dirty rows for the flush that dies
        request(seq)
    crash(shard, during_flush=point, meanwhile=lambda: [request(seq) for seq in (7, 8)])
    store = Store(str(tmp_path))
    try:  # where the crash landed: the journal position the flush covered is recorded only at the last point
        assert (store.meta.flushed_seq() > flushed) == (point == "position_recorded")
    finally:
        store.close()
    assert os.listdir(tmp_path / "journal"), "the journal was trimmed"

    shard = open_shard(tmp_path)
    try:
        for name, expected in want.items():
            np.testing.assert_array_equal(shard.pull(name, POOL), expected, err_msg=name)
        assert shard.journal.applied[7] == (8, 2)
        assert shard.push_batch(sent[-1], 0, client=7, client_seq=8)[1] == 0  # sent again: applied already
        for name, expected in want.items():
            np.testing.assert_array_equal(shard.pull(name, POOL), expected, err_msg=name)
    finally:
        shard.close()


def test_a_batch_with_repeated_ids_in_a_later_push_changes_nothing(tmp_path):
    shard = open_shard(tmp_path)
    try:
        twice = np.concatenate([B[:3], B[:1]])
        with pytest.raises(InvalidArgumentError, match="push 1 of the batch .* repeats ids; nothing was applied"):
            shard.push_batch([push(A, 1.0), push(twice, 1.0)], 1, client=7, client_seq=1)
        assert (rows(shard, A) == 0).all() and shard.clock == 0 and 7 not in shard.journal.applied
    finally:
        shard.close()


def test_the_client_sends_a_push_again_when_its_reply_is_lost_and_it_is_applied_once(servers, monkeypatch):
    addresses, shards = servers(2)
    lost = []

    def apply_then_lose_the_reply(original):
        def push_batch(*args, **kwargs):
            result = original(*args, **kwargs)
            if len(lost) < 3:  # the first three replies never reach the client
                lost.append(args)
                raise ShardClosingError("the server went away before replying")  # UNAVAILABLE
            return result

        return push_batch

    for s in shards:
        monkeypatch.setattr(s.shard, "push_batch", apply_then_lose_the_reply(s.shard.push_batch))
    with Client(addresses, timeout_s=5, server_timeout_s=30) as client:
        client.create_table(SUM)
        ids = np.concatenate([A, B])
        for _ in range(3):
            client.push("sum", ids, np.ones((len(ids), 2), np.float32))
        np.testing.assert_array_equal(client.pull("sum", ids), np.full((len(ids), 2), -3.0))
    assert len(lost) == 3


def test_a_shards_batches_go_in_order_and_the_clock_moves_after_them(servers):
    addresses, shards = servers(2)
    with Client(addresses, max_request_bytes=200) as client:  # ~8 ids per batch: many batches per shard
        client.create_table(SUM)
        other = TableConfig("other", 3)
        client.create_table(other)
        ids = random_ids(300, seed=3)
        for step in range(3):
            client.push_many([push(ids, 1.0)[:4], ("other", B, np.ones((len(B), 3)), None)], advance_clock=1)
            for s in shards:
                mine = ids[s.shard.slot_map.shard_of(ids) == s.shard.shard_id]
                t = s.shard.table("sum")
                assert (t.peek(mine)[:, t.stats_col + LAST_STEP] == step).all()  # stamped before the advance
                assert s.shard.clock == step + 1
        np.testing.assert_array_equal(client.pull("sum", ids), np.full((300, 2), -3.0))
