"""A checkpoint and a Shrink exclude each other on a shard (ps.engine.hold PushHold.shrink_slot), so a checkpoint
holds a Shrink wholly or not at all: a hold asked for while a Shrink runs is refused, holding nothing, and a Shrink
asked for while a hold lasts, or a save runs, is refused at once, applying nothing. The overlaps are made with
events, not timing."""

from __future__ import annotations

import contextlib
import re
import threading
import time

import numpy as np
import pytest

from ps.config import EvictionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.checkpointing import ShardCheckpoints
from ps.engine.hold import PushHold
from ps.engine.shard import Shard
from ps.engine.shrinkprogress import ShrinkProgress
from ps.errors import CheckpointHoldError
from ps.rows.layout import SHOW
from ps.server_config import ServerConfig
from ps.sharding import SlotMap
from tests.conftest import random_ids
from tests.waiting import wait_until
from worker.__main__ import main
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


SINCE = r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, \d+ s ago"
REFUSED = (
    "; a Shrink run meanwhile would be saved in part by that checkpoint, so a shard runs no Shrink while a checkpoint "
    "holds it or saves: send the Shrink once that checkpoint has ended; nothing was applied"
)


def test_a_shrink_asked_for_while_a_checkpoint_saves_is_refused_at_once_and_runs_once_it_ended(
    servers, tmp_path, monkeypatch, capsys
):
    """A save stops as it begins to write; `ps-worker shrink` then fails at once (exit 2), saying a checkpoint holds
    the shard since when, for how long, and to send the Shrink once it has ended; the Client raises the shard's
    CheckpointHoldError. Nothing of it was applied, and the checkpoint holds none of it (4 shows, live and
    restored); sent once the save ended, it runs (2 shows live)."""
    addresses, (server,) = servers(1, checkpoint_root=str(tmp_path))
    saving, go_on = threading.Event(), threading.Event()
    write = ShardCheckpoints.write

    def stop_before_writing(self, path: str, caller_gone=None) -> dict:
        saving.set()
        assert go_on.wait(30)
        return write(self, path, caller_gone)

    monkeypatch.setattr(ShardCheckpoints, "write", stop_before_writing)
    with Client(addresses, timeout_s=30, server_timeout_s=5) as client:
        _trained(client)
        saver = threading.Thread(target=save, args=(client, str(tmp_path / "ckpt")))
        saver.start()
        try:
            assert saving.wait(30)
            capsys.readouterr()
            assert main(["shrink", "--servers", addresses[0]]) == 2  # answered while the save is stopped
            with pytest.raises(CheckpointHoldError) as refused:
                client.shrink()
        finally:
            go_on.set()
            saver.join(30)
        said = capsys.readouterr().err.strip()
        assert re.fullmatch(
            rf"ps-worker: error: shard 0 at \S+: Shrink failed with FAILED_PRECONDITION: shard 0: a checkpoint holds "
            rf"it {SINCE} \(it saves now; its hold lasts on after the save until that checkpoint releases it, \d+ s after "
            rf"the save has ended at the latest\){re.escape(REFUSED)}",
            said,
        ), said
        assert str(refused.value).startswith(f"shard 0 at {addresses[0]}: Shrink failed with FAILED_PRECONDITION")
        assert server.shard.shrink_running.running is None  # a refused Shrink holds no slot
        for name in ("a", "b"):
            table = server.shard.table(name)
            np.testing.assert_array_equal(table.peek(IDS)[:, table.stats_col + SHOW], np.full(len(IDS), 4.0))
        assert main(["shrink", "--servers", addresses[0]]) == 0
    for name, shows in _restored_shows(tmp_path, str(tmp_path / "ckpt"), 1).items():
        np.testing.assert_array_equal(shows, np.full(len(IDS), 4.0), err_msg=name)  # the Shrink is not in it
        table = server.shard.table(name)
        np.testing.assert_array_equal(table.peek(IDS)[:, table.stats_col + SHOW], np.full(len(IDS), 2.0))


def _refused(gate: PushHold) -> str:
    """The message of a Shrink that gate refuses; fails if its block runs."""
    with pytest.raises(CheckpointHoldError) as refused, gate.shrink_slot(lambda: "a Shrink is running"):
        pytest.fail("a Shrink ran while a checkpoint held the shard")
    return str(refused.value)


def test_a_shrink_is_refused_while_a_hold_waits_for_pushes_or_lasts_and_runs_once_it_expired():
    """PushHold alone: a hold waiting for the push in flight refuses a Shrink (saying it waits, then lasts up to its
    timeout and its save), and so does the hold it then is (saying when it expires at the latest); a hold that
    expired (its saver died) lets a Shrink in, and a hold asked for while that runs is refused."""
    gate = PushHold(4)
    pushing = contextlib.ExitStack()
    pushing.enter_context(gate.push_gate())  # a push in flight: the hold waits for it
    held: list = []
    holder = threading.Thread(target=lambda: held.append(gate.hold(60, lambda: 0)))
    holder.start()
    try:
        wait_until(lambda: gate._waiting, 30, "the hold to wait for the push in flight")
        said = _refused(gate)
    finally:
        pushing.close()
        holder.join(30)
    assert re.fullmatch(rf"shard 4: a checkpoint holds it {SINCE} \(its hold waits for the pushes in flight, then "
                        rf"lasts up to 60 s, and while its save runs\){re.escape(REFUSED)}", said), said  # fmt: skip
    said = _refused(gate)
    assert re.fullmatch(rf"shard 4: a checkpoint holds it {SINCE} \(until that checkpoint releases it after its save, "
                        rf"or its hold expires, (59|60) s from now at the latest\){re.escape(REFUSED)}", said), said  # fmt: skip
    gate.release(held[0][1])
    gate.hold(0.001, lambda: 0)  # a hold its saver never releases: it expires
    wait_until(lambda: time.monotonic() >= gate.held_until, 30, "the hold's expiry")
    entered = []
    with gate.shrink_slot(lambda: "a Shrink is running (of table 't')"):
        entered.append(True)
        with pytest.raises(CheckpointHoldError, match=r"^shard 4: a Shrink is running \(of table 't'\); a checkpoint"):
            gate.hold(60, lambda: 0)
    assert entered and gate.hold(60, lambda: 0)[1]  # taken once the Shrink ended


def test_a_save_whose_hold_was_released_while_it_runs_refuses_a_shrink_and_a_hold_until_it_ends():
    """PushHold alone: a checkpoint releases its hold while a save still writes (worker.checkpoint releases every
    shard once one shard's save failed). A Shrink asked for then is refused, saying a save runs on; so is a hold
    (its save would wait for that one's end, pushes paused meanwhile). Both are had once the save has ended."""
    gate = PushHold(2)
    token = gate.hold(60, lambda: 0)[1]
    writing, written = threading.Event(), threading.Event()

    def save_one() -> None:
        with gate.saving(token):
            writing.set()
            assert written.wait(30)

    saver = threading.Thread(target=save_one)
    saver.start()
    try:
        assert writing.wait(30)
        gate.release(token)  # the save writes on
        said = _refused(gate)
        with pytest.raises(CheckpointHoldError) as hold_refused:
            gate.hold(60, lambda: 0)
    finally:
        written.set()
        saver.join(30)
    on = rf"shard 2: a checkpoint's save runs on it {SINCE}, its hold released"
    assert re.fullmatch(on + re.escape(REFUSED), said), said
    said = str(hold_refused.value)
    assert re.fullmatch(on + "; one checkpoint at a time: take this one once that save has ended; nothing is held",
                        said), said  # fmt: skip
    ran = []
    with gate.shrink_slot(lambda: "a Shrink is running"):
        ran.append(True)
    assert ran and gate.hold(60, lambda: 0)[1]
