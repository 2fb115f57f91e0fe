"""A checkpoint and a Shrink exclude each other on a shard (ps.engine.hold PushHold.shrink_slot), so a checkpoint
holds a Shrink wholly or not at all: a hold asked for while a Shrink runs is refused, holding nothing, and a Shrink
asked for while a hold lasts, or a save runs, waits for both to end. The overlaps are made with events, not timing."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from ps.config import EvictionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.checkpointing import ShardCheckpoints
from ps.engine.hold import PushHold
from ps.engine.shard import Shard
from ps.engine.shrinkprogress import ShrinkProgress
from ps.errors import CallerGoneError, CheckpointHoldError, ShrinkRunningError
from ps.rows.layout import SHOW
from ps.server_config import ServerConfig
from ps.sharding import SlotMap
from tests.callers import StandInCaller
from tests.conftest import random_ids
from tests.waiting import wait_until
from worker.checkpoint import save
from worker.client import Client

HALVED = EvictionConfig(decay=0.5)
TABLES = [TableConfig(name, 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0), eviction=HALVED)
          for name in ("a", "b")]  # fmt: skip
IDS = random_ids(16, seed=29)


def _trained(client: Client) -> None:
    """Tables a and b, each id of IDS pushed with 4 shows."""
    client.wait_ready()
    for cfg in TABLES:
        client.create_table(cfg)
        many = np.repeat(IDS, 4)
        client.push(cfg.name, many, np.zeros((len(many), 2), np.float32))


def _restored_shows(tmp_path, ckpt: str, n: int) -> dict[str, np.ndarray]:
    """Each table's shows of IDS in the checkpoint ckpt of n shards, each id read from a shard restored from it."""
    owner = SlotMap.contiguous(n).shard_of(IDS)
    shows = {cfg.name: np.zeros(len(IDS), np.float32) for cfg in TABLES}
    for i in range(n):
        shard = Shard(ServerConfig(data_dir=str(tmp_path / f"restored-{i}"), shard_id=i, num_shards=n,
                                   restore_dir=ckpt))  # fmt: skip
        try:
            for name, out in shows.items():
                table = shard.table(name)
                out[owner == i] = table.peek(IDS[owner == i])[:, table.stats_col + SHOW]
        finally:
            shard.close()
    return shows


def test_a_save_asked_for_while_a_shrink_runs_is_refused_and_holds_no_shard(servers, tmp_path, monkeypatch):
    """A Shrink of tables a and b on two shards stops on one shard once table a is shrunk whole, before b. A save
    then is refused there (FAILED_PRECONDITION, naming the Shrink and what to do), and no shard is held: pushes go
    on. Once the Shrink ended, a save holds it whole: every row of both tables decayed once."""
    addresses, started = servers(2, checkpoint_root=str(tmp_path))
    between, go_on = threading.Event(), threading.Event()
    scanned = ShrinkProgress.scanned

    def stop_between_tables(self, table: str, n: int) -> None:
        scanned(self, table, n)
        if table == "a" and not between.is_set():  # the first shard's, once table a is shrunk whole
            between.set()
            go_on.wait(30)

    monkeypatch.setattr(ShrinkProgress, "scanned", stop_between_tables)
    shrunk: list = []
    with Client(addresses, timeout_s=30, server_timeout_s=5) as client:
        _trained(client)
        thread = threading.Thread(target=lambda: shrunk.append(client.shrink()))
        thread.start()
        try:
            assert between.wait(30)
            wait_until(lambda: sum(s.shard.shrink_running.running is None for s in started) == 1, 30,
                       "the other shard's Shrink to end")  # fmt: skip
            with pytest.raises(CheckpointHoldError) as refused:
                save(client, str(tmp_path / "during"))
            client.push("a", IDS, np.zeros((len(IDS), 2), np.float32))  # no shard is held: taken (2 shows more)
        finally:
            go_on.set()
            thread.join(30)
        assert shrunk and [r.dropped for r in shrunk[0]] == [0, 0]
        said = str(refused.value)
        assert re.fullmatch(
            r"shard (\d) at \S+: Checkpoint failed with FAILED_PRECONDITION: shard \1: a Shrink is running \(of "
            r"tables 'a', 'b', since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, \d+ s ago: \d+ of \d+ rows scanned so far\); "
            "a checkpoint saved meanwhile would hold part of that Shrink, so a shard takes no checkpoint hold while "
            r"one runs: save once it has ended \(the shard's log says how far it got, and 'shrink at step \.\.\.' once "
            r"it ended\); nothing is held",
            said,
        ), said
        assert not (tmp_path / "during").exists()
        save(client, str(tmp_path / "after"))
    shows = _restored_shows(tmp_path, str(tmp_path / "after"), 2)
    np.testing.assert_array_equal(shows["a"], np.full(len(IDS), 3.0))  # 4 * 0.5, then 1 more show
    np.testing.assert_array_equal(shows["b"], np.full(len(IDS), 2.0))  # 4 * 0.5


def test_a_shrink_asked_for_while_a_checkpoint_holds_the_shard_waits_for_its_release(servers, tmp_path, monkeypatch):
    """A save stops as it begins to write; a Shrink sent then waits for the checkpoint's hold to end: the checkpoint
    holds none of it (4 shows restored), and it runs once the save released the shard (2 shows live)."""
    addresses, (server,) = servers(1, checkpoint_root=str(tmp_path))
    saving, go_on = threading.Event(), threading.Event()
    write = ShardCheckpoints.write

    def stop_before_writing(self, path: str, caller_gone=None) -> dict:
        saving.set()
        assert go_on.wait(30)
        return write(self, path, caller_gone)

    monkeypatch.setattr(ShardCheckpoints, "write", stop_before_writing)
    gate = server.shard.checkpoints.gate
    waiting, wait = threading.Event(), gate._gate.wait

    def told(timeout=None):  # a wait on the gate's condition: the Shrink's for the hold (no push is in flight)
        waiting.set()
        return wait(timeout)

    gate._gate.wait = told
    shrunk: list = []
    with Client(addresses, timeout_s=30, server_timeout_s=5) as client:
        _trained(client)
        saver = threading.Thread(target=save, args=(client, str(tmp_path / "ckpt")))
        saver.start()
        try:
            assert saving.wait(30)
            shrinker = threading.Thread(target=lambda: shrunk.append(client.shrink()))
            shrinker.start()
            wait_until(lambda: waiting.is_set() or not shrinker.is_alive(), 30, "the Shrink waits, or has ended")
            assert not shrunk, "a Shrink ran while a checkpoint held the shard"
        finally:
            go_on.set()
            saver.join(30)
        shrinker.join(30)
        assert shrunk and [r.dropped for r in shrunk[0]] == [0]
    for name, shows in _restored_shows(tmp_path, str(tmp_path / "ckpt"), 1).items():
        np.testing.assert_array_equal(shows, np.full(len(IDS), 4.0), err_msg=name)  # the Shrink is not in it
        table = server.shard.table(name)
        np.testing.assert_array_equal(table.peek(IDS)[:, table.stats_col + SHOW], np.full(len(IDS), 2.0))


def test_a_shrink_waiting_for_a_hold_goes_ahead_at_its_expiry_and_one_whose_caller_left_is_dropped():
    """PushHold alone: a hold that expires (its saver died) lets the waiting Shrink in, and a hold is refused while
    it runs; a Shrink whose caller leaves while it waits runs nothing."""
    gate = PushHold(4)
    gate.hold(0.2, lambda: 0)
    entered = []
    with gate.shrink_slot(lambda: "a Shrink is running (of table 't')"):  # waits for the 0.2 s hold's expiry
        entered.append(True)
        with pytest.raises(CheckpointHoldError, match=r"^shard 4: a Shrink is running \(of table 't'\); a checkpoint"):
            gate.hold(60, lambda: 0)
    assert entered and gate.hold(60, lambda: 0)[1]  # taken once the Shrink ended
    caller, failed = StandInCaller(), []

    def shrink() -> None:
        try:
            with gate.shrink_slot(lambda: "a Shrink", caller):
                entered.append(False)
        except CallerGoneError as e:
            failed.append(e)

    waiting, wait = threading.Event(), gate._gate.wait
    gate._gate.wait = lambda timeout=None: waiting.set() or wait(timeout)
    thread = threading.Thread(target=shrink)
    thread.start()
    assert waiting.wait(30)
    caller.leave()
    thread.join(30)
    assert entered == [True] and failed and "its caller left" in str(failed[0]), failed


def test_a_shrink_sent_while_another_waits_for_a_hold_is_refused_saying_that_one_waits(tmp_path):
    """A Shrink waits while a checkpoint holds its shard; a second one sent meanwhile is refused (one at a time),
    its message saying the first waits for the hold (not that it runs, 0 rows scanned); the first runs once the
    hold is released."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))
    try:
        for cfg in TABLES:
            shard.create_table(cfg)
            shard.push(cfg.name, IDS, np.zeros((len(IDS), 2), np.float32))
        _, token = shard.hold(60)
        gate = shard.checkpoints.gate
        waiting, wait = threading.Event(), gate._gate.wait
        gate._gate.wait = lambda timeout=None: waiting.set() or wait(timeout)
        shrunk: list = []
        first = threading.Thread(target=lambda: shrunk.append(shard.shrink("a")))
        first.start()
        try:
            assert waiting.wait(30)
            with pytest.raises(ShrinkRunningError) as refused:
                shard.shrink("b")
        finally:
            shard.release(token)
            first.join(30)
        said = str(refused.value)
        assert re.match(
            r"shard 0: a Shrink is waiting for a checkpoint's hold to end \(of table 'a', since \d{4}-\d\d-\d\d "
            rf"\d\d:\d\d:\d\d UTC, \d+ s ago; it then scans {len(IDS)} rows\); one Shrink at a time: send no Shrink",
            said,
        ), said
        assert shrunk and shrunk[0]["num_rows"] == len(IDS)
    finally:
        shard.close()


def test_a_shrink_waits_for_a_save_whose_hold_was_released_while_it_runs():
    """PushHold alone: a checkpoint releases its hold while a save still writes (worker.checkpoint releases every
    shard once one shard's save failed). A Shrink asked for then waits for the save's end, not the hold's."""
    gate = PushHold(2)
    token = gate.hold(60, lambda: 0)[1]
    writing, written, order = threading.Event(), threading.Event(), []

    def save_one() -> None:
        with gate.saving(token):
            writing.set()
            assert written.wait(30)
            order.append("save ended")

    saver = threading.Thread(target=save_one)
    saver.start()
    assert writing.wait(30)
    gate.release(token)  # the save writes on
    waiting, wait = threading.Event(), gate._gate.wait
    gate._gate.wait = lambda timeout=None: waiting.set() or wait(timeout)

    def shrink() -> None:
        with gate.shrink_slot(lambda: "a Shrink is running (of table 't')"):
            order.append("shrink ran")

    shrinker = threading.Thread(target=shrink)
    shrinker.start()
    try:
        wait_until(lambda: waiting.is_set() or not shrinker.is_alive(), 30, "the Shrink waits, or has run")
        assert order == [], "a Shrink ran while a save wrote"
    finally:
        written.set()
        saver.join(30)
        shrinker.join(30)
    assert order == ["save ended", "shrink ran"]
