"""The hold a checkpoint takes on a shard: pushes are refused while it lasts, a save needs the hold's token and a
hold that has not expired, only the holder releases it, and it cannot be held twice."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time

import numpy as np
import pytest

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine import hold as hold_module
from ps.engine.hold import PushHold
from ps.engine.shard import Shard
from ps.errors import CallerGoneError, CheckpointHoldError, CheckpointInProgressError
from ps.server_config import ServerConfig
from tests.callers import StandInCaller
from tests.waiting import wait_until


def pushed(shard: Shard, ids: np.ndarray) -> bool:
    """Pushes ones for ids; False if the shard refused it because a checkpoint holds it."""
    try:
        shard.push("t", ids, np.ones((len(ids), 2), np.float32))
    except CheckpointInProgressError:
        return False
    return True


def test_hold_save_release(tmp_path, caplog):
    caplog.set_level("INFO", "ps.engine.shard")
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))
    try:
        shard.create_table(TableConfig("t", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0)))
        ids = np.arange(3, dtype=np.uint64)
        _, token = shard.hold(60)
        with pytest.raises(CheckpointInProgressError, match="taking a checkpoint"):
            shard.push("t", ids, np.ones((3, 2), np.float32))
        with pytest.raises(CheckpointHoldError, match=r"^shard 0 is held by another checkpoint \(until that checkpoint "
                           r"releases it after its save, or its hold expires, (59|60) s from now at the latest\); "
                           r"one checkpoint at a time"):  # fmt: skip
            shard.hold(60)
        shard.release("not-the-token")  # a stale token releases nothing
        with pytest.raises(CheckpointInProgressError):
            shard.push("t", ids, np.ones((3, 2), np.float32))
        with pytest.raises(CheckpointHoldError, match=r"^shard 0: it is held by another checkpoint \(the token is "
                                                      r"not its hold's\)"):  # fmt: skip
            shard.save_checkpoint(str(tmp_path / "c1"), "not-the-token")
        assert shard.save_checkpoint(str(tmp_path / "c1"), token)["rows"] == {"t": 0}
        shard.release(token)
        told = [r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()]
        assert told[0] == "checkpoint hold taken: pushes paused for at most 60 s", told
        assert (
            told[1].startswith(f"checkpoint saved to {tmp_path / 'c1' / 'shard-0'} in ")
            and " 0 rows, clock 0" in told[1]
        )
        assert re.fullmatch(r"checkpoint hold released after [\d.]+ s: taking pushes again \(2 refused meanwhile, "
                            r"which clients retry\)", told[2]), told  # fmt: skip
        shard.push("t", ids, np.ones((3, 2), np.float32))

        _, token = shard.hold(0.05)  # expires before the save: pushes go on, the save is refused
        wait_until(lambda: pushed(shard, ids), 10, "pushes taken again once the 0.05 s hold expired")
        np.testing.assert_array_equal(shard.pull("t", ids), np.full((3, 2), -2, np.float32))  # refused: no change
        with pytest.raises(CheckpointHoldError, match="hold expired"):
            shard.save_checkpoint(str(tmp_path / "c2"), token)
        assert not (tmp_path / "c2").exists()
        assert "checkpoint hold expired 0 s after it was taken, without a release (the process that took it died" in (
            caplog.text
        )
    finally:
        shard.close()


def test_a_restore_that_did_not_finish_is_refused_at_start(tmp_path):
    from ps.errors import StorageError
    from ps.storage.store import Store

    store = Store(str(tmp_path / "d"))
    store.meta.check_identity(0, 1)
    store.meta.set_restore_pending("/backups/ckpt")  # as a crash in the middle of restore_into leaves it
    store.close()
    for restore in (None, str(tmp_path / "ckpt")):
        with pytest.raises(StorageError, match="holds a restore from /backups/ckpt that did not finish"):
            Shard(ServerConfig(data_dir=str(tmp_path / "d"), restore_dir=restore))


def test_a_hold_refused_while_another_checkpoint_saves_says_its_hold_lasts_on_after_the_save(tmp_path):
    """While another checkpoint's save runs (its hold cannot expire then), a hold is refused saying that checkpoint
    saves now and its hold lasts on after the save until that checkpoint releases it, its 120 s hold timeout after
    the save at the latest (counted again from the save's end): no time from now, which the save may outlast."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))
    try:
        _, token = shard.hold(120)
        with shard.checkpoints.gate.saving(token), pytest.raises(CheckpointHoldError) as refused:
            shard.hold(60)
        assert str(refused.value) == (
            "shard 0 is held by another checkpoint (it saves now; its hold lasts on after the save until that "
            "checkpoint releases it, 120 s after the save has ended at the latest); one checkpoint at a time: take "
            "this one once that one has ended; nothing is held"
        )
        with pytest.raises(CheckpointHoldError, match=r"held by another checkpoint \(until that checkpoint releases "
                           r"it after its save, or its hold expires, (119|120) s from now"):  # fmt: skip
            shard.hold(60)  # the save ended: its hold lasts on
        shard.release(token)
    finally:
        shard.close()


def test_a_save_meeting_another_checkpoints_hold_fails_at_once_and_releases_what_it_held(tmp_path):
    """Another checkpoint holds shard 1: a save holds shard 0 (shard order), is refused at shard 1 at once
    (FAILED_PRECONDITION, not retried until the server timeout), and releases shard 0; once the other hold ends,
    the save goes through."""
    from ps.errors import CheckpointHoldError
    from ps.server import Server
    from worker.checkpoint import save
    from worker.client import Client

    servers = [Server(ServerConfig(data_dir=str(tmp_path / f"d{i}"), shard_id=i, num_shards=2, port=0,
                                   checkpoint_root=str(tmp_path))) for i in range(2)]  # fmt: skip
    for s in servers:
        s.start()
    try:
        with Client([f"127.0.0.1:{s.port}" for s in servers], timeout_s=10, server_timeout_s=30) as client:
            client.create_table(TableConfig("t", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0)))
            _, other = servers[1].shard.hold(60)
            started = time.monotonic()
            with pytest.raises(CheckpointHoldError, match="FAILED_PRECONDITION: shard 1 is held by another checkpoint"):
                save(client, str(tmp_path / "c1"))  # the server's own class, which it names (ps.errornames.error_class)
            assert time.monotonic() - started < 5  # not the 30 s server timeout
            gate = servers[0].shard.checkpoints.gate
            assert gate.held_until == 0 and pushed(servers[0].shard, np.arange(3, dtype=np.uint64))
            assert not (tmp_path / "c1").exists()
            servers[1].shard.release(other)
            assert save(client, str(tmp_path / "c2"))["num_shards"] == 2
    finally:
        for s in servers:
            s.stop(grace_s=1)


def test_a_save_into_a_dir_the_server_cannot_write_is_refused_as_the_operators_fault(tmp_path, monkeypatch):
    from ps.errors import CheckpointDirError

    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))
    try:
        _, token = shard.hold(60)
        monkeypatch.setattr("ps.engine.checkpointing.os.access", lambda path, mode, **kw: False)  # a read-only dir
        with pytest.raises(CheckpointDirError, match=r"checkpoint dir .*/c/new is not writable by this server"):
            shard.save_checkpoint(str(tmp_path / "c" / "new"), token)
        assert CheckpointDirError.status == "FAILED_PRECONDITION" and not (tmp_path / "c").exists()
    finally:
        shard.close()


def test_a_save_whose_dir_another_shards_failed_save_removed_before_its_look_makes_it_again(tmp_path, monkeypatch):
    """The shards of a checkpoint save into one directory at once: one whose save fails removes it while it is
    empty, and another shard that made it (or found it made) may look at it just then. It finds it gone, not
    unwritable: it makes it again and saves, so the failed shard's error is the one the caller reads."""
    real = hold_module._make_dirs
    calls = []

    def made_then_removed_by_another_shard(directory: str) -> list[str]:
        calls.append(directory)
        made = real(directory)
        if len(calls) == 1:
            for d in reversed(made):
                os.rmdir(d)
            return []  # (the other shard's: it made them and removed them again)
        return made

    monkeypatch.setattr(hold_module, "_make_dirs", made_then_removed_by_another_shard)
    directory = str(tmp_path / "out" / "checkpoint.new")
    assert hold_module.save_into(directory, "shard-0", "", lambda path: os.makedirs(path) or "saved") == "saved"
    assert len(calls) == 2 and os.path.isdir(os.path.join(directory, "shard-0"))


def test_a_save_on_a_shard_that_took_no_hold_since_it_started_says_why_it_may_be():
    from ps.engine.hold import PushHold

    fresh = PushHold(1)  # a new process: no hold taken (a save sent without one, or the shard restarted since)
    with pytest.raises(CheckpointHoldError, match=r"^shard 1: it has taken no checkpoint hold since it started \(none "
                                                  r"was taken, or the shard restarted since it was\); take the hold "
                                                  r"first; nothing saved$"), fresh.saving(""):  # fmt: skip
        pass
    held = PushHold(1)
    _, token = held.hold(30, lambda: 0)
    held.release(token)
    with pytest.raises(CheckpointHoldError, match="expired or was released before the save"), held.saving(token):
        pass


def test_save_running_is_true_inside_a_save_only():
    """What a ps-server's second signal asks before it exits at once (ps.server_run): a save is running."""
    from ps.engine.hold import PushHold

    held = PushHold(0)
    _, token = held.hold(30, lambda: 0)
    assert not held.save_running
    with held.saving(token):
        assert held.save_running
    assert not held.save_running
    held.release(token)


def test_held_s_sums_every_holds_time_a_lasting_one_until_now_an_expired_one_until_its_expiry(monkeypatch):
    """What a pull's barrier timeout leaves out (ps.engine.jobs): the seconds holds refused pushes, summed over holds
    released, expired (seen by a push, by the next hold, or by nobody) and lasting, a save's time included."""
    now = [1000.0]
    monkeypatch.setattr(hold_module.time, "monotonic", lambda: now[0])
    gate = PushHold(0)
    assert gate.held_s(now[0]) == 0.0
    _, token = gate.hold(30, lambda: 0)
    now[0] += 2
    assert gate.held_s(now[0]) == 2.0  # lasting: until now
    with gate.saving(token):
        now[0] += 40  # a save outlasting the hold's timeout: it cannot expire meanwhile
    now[0] += 1
    gate.release(token)
    assert gate.held_s(now[0] + 5) == 43.0  # released: its time is kept, and no more counts
    gate.hold(3, lambda: 0)
    now[0] += 10
    assert gate.held_s(now[0]) == 46.0  # expired, seen by nobody: until its expiry
    with gate.push_gate():  # a push sees the expiry and ends the hold
        pass
    assert gate.held_s(now[0]) == 46.0
    gate.hold(3, lambda: 0)
    now[0] += 5
    _, token = gate.hold(3, lambda: 0)  # over the expired one, which counts until its expiry
    now[0] += 1
    assert gate.held_s(now[0]) == 50.0
    assert gate.held_s(now[0] - 2) == 49.0  # a time before this hold was taken: none of it
    gate.release(token)


def test_a_save_whose_dir_another_shards_failed_save_removed_writes_again(tmp_path, caplog):
    """The shards of a checkpoint save into one directory at once: shard 1 makes it, shard 0 finds it there, then
    shard 1's save fails and removes it, empty, before shard 0's write puts anything in it. Shard 0 saves all the
    same (its write runs again), so the checkpoint's error is shard 1's, not an I/O error of shard 0's."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))
    directory = tmp_path / "c"
    directory.mkdir()  # shard 1's
    real_write, writes = shard.checkpoints.write, []

    def write_after_the_other_shard_gave_up(path: str, caller_gone=None) -> dict:
        writes.append(path)
        if len(writes) == 1:
            directory.rmdir()  # shard 1's failed save cleans up
        return real_write(path, caller_gone)

    shard.checkpoints.write = write_after_the_other_shard_gave_up
    try:
        _, token = shard.hold(60)
        saved = shard.save_checkpoint(str(directory), token)
        assert len(writes) == 2 and saved["dir"] == "shard-0" and (directory / "shard-0" / "CURRENT").exists()
        assert any("was removed while this shard began to write" in r.getMessage() for r in caplog.records)
    finally:
        shard.close()


def test_a_save_whose_caller_left_makes_nothing_and_its_write_into_a_dir_removed_is_not_run_again(tmp_path):
    """A save whose caller is gone (its RPC cancelled: an interrupted ps-worker export, which removes the directory it
    gave as it ends) makes no directory, and a write that failed because the directory went away is not run again:
    the caller removed it, and nobody would read what a second write made there."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))
    directory, caller = tmp_path / "out" / "c", StandInCaller(gone=True)
    real_write, writes = shard.checkpoints.write, []

    def write_as_the_caller_leaves(path: str, caller_gone=None) -> dict:
        writes.append(path)
        caller.leave()
        shutil.rmtree(tmp_path / "out")  # the caller's undo of its fresh checkpoint and of the OUT it made
        return real_write(path, caller_gone)

    shard.checkpoints.write = write_as_the_caller_leaves
    try:
        _, token = shard.hold(60)
        with pytest.raises(CallerGoneError, match=rf"^the caller of the save into {directory} left; nothing saved$"):
            shard.save_checkpoint(str(directory), token, caller)
        assert not (tmp_path / "out").exists() and writes == []
        caller.gone = False  # leaves as the write begins: the write sees it (after its flush), and is not run again
        with pytest.raises(CallerGoneError, match=rf"^the caller of the save into {directory} left; nothing saved$"):
            shard.save_checkpoint(str(directory), token, caller)
        assert len(writes) == 1 and not (tmp_path / "out").exists()
    finally:
        shard.close()


@pytest.mark.parametrize("leaves", ["as_its_dirs_are_made", "during_the_rocksdb_checkpoint"])
def test_a_save_whose_caller_leaves_once_it_began_leaves_no_checkpoint(tmp_path, monkeypatch, leaves):
    """The caller leaves after the save's own look at it: as the save makes its directories (the caller's undo ran
    before, and the save makes them again), or while RocksDB writes the checkpoint (the caller's undo, which runs
    meanwhile, cannot remove a folder being written into). The save fails, and leaves neither the shard's checkpoint
    nor the directories it made; the shard saves again for a caller that stays."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))
    directory, caller = tmp_path / "out" / "c", StandInCaller()
    real_make_dirs, real_checkpoint = hold_module._make_dirs, shard.checkpoints.store.checkpoint

    def make_dirs_as_the_caller_leaves(path: str) -> list[str]:
        caller.leave()
        shutil.rmtree(tmp_path / "out", ignore_errors=True)  # the caller's undo: nothing there yet
        return real_make_dirs(path)

    def checkpoint_as_the_caller_leaves(path: str) -> None:
        caller.leave()  # its undo's rmtree ran while RocksDB wrote, and failed: modelled by no removal at all
        real_checkpoint(path)

    if leaves == "as_its_dirs_are_made":
        monkeypatch.setattr(hold_module, "_make_dirs", make_dirs_as_the_caller_leaves)
    else:
        monkeypatch.setattr(shard.checkpoints.store, "checkpoint", checkpoint_as_the_caller_leaves)
    try:
        shard.create_table(TableConfig("emb", 2))
        shard.push("emb", np.arange(10, dtype=np.uint64), np.ones((10, 2), np.float32))
        _, token = shard.hold(60)
        with pytest.raises(CallerGoneError, match=rf"^the caller of the save into {directory} left; nothing saved$"):
            shard.save_checkpoint(str(directory), token, caller)
        assert not (tmp_path / "out").exists()
        assert not shard.checkpoints.gate.save_running
        monkeypatch.undo()
        saved = shard.save_checkpoint(str(directory), token, StandInCaller())
        assert saved["rows"] == {"emb": 10} and (directory / "shard-0" / "CURRENT").exists()
    finally:
        shard.close()


def test_a_save_whose_dir_keeps_going_away_gives_up_after_its_tries(tmp_path):
    from ps.engine.hold import SAVE_TRIES

    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))
    directory, writes = tmp_path / "c", []
    directory.mkdir()

    def write_into_a_dir_removed_each_time(path: str, caller_gone=None) -> None:
        writes.append(path)
        directory.mkdir(exist_ok=True)
        directory.rmdir()
        raise OSError(2, "No such file or directory", path)

    shard.checkpoints.write = write_into_a_dir_removed_each_time
    try:
        _, token = shard.hold(60)
        with pytest.raises(OSError, match="No such file"):
            shard.save_checkpoint(str(directory), token)
        assert len(writes) == SAVE_TRIES
    finally:
        shard.close()


def test_a_checkpoint_dir_another_shard_made_and_removed_meanwhile_is_made_again(tmp_path, monkeypatch):
    """Another shard's mkdir wins, and its failed save removes the directory before this one looks at it: this
    shard makes it again (the FileExistsError it saw is no file in the way)."""
    import os

    from ps.engine import hold

    target = tmp_path / "out" / "checkpoint.new"
    real_mkdir = os.mkdir
    raced = []

    def mkdir(path, *args, **kwargs):
        if str(path) == str(target) and not raced:
            raced.append(path)  # the other shard made it and removed it again
            raise FileExistsError(17, "File exists", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(hold.os, "mkdir", mkdir)
    assert hold._make_dirs(str(target)) == [str(tmp_path / "out"), str(target)]
    assert raced and target.is_dir()


@pytest.mark.parametrize("failing", ["file_checksums", "admitted_counts"])
def test_a_save_that_fails_once_rocksdb_wrote_the_checkpoint_leaves_nothing_behind(tmp_path, monkeypatch, failing):
    """Reading the checkpoint back (its files' sha256s, its rows per table) fails after RocksDB wrote it: the save
    fails, and neither shard-<i> nor the directories it created are left; the next save goes ahead."""

    def fails(path: str):
        raise OSError(5, "Input/output error", path)

    if failing == "file_checksums":
        monkeypatch.setattr("ps.engine.checkpointing.file_checksums", fails)
    else:  # Store.saved_counts reads the checkpoint back with it
        monkeypatch.setattr("ps.storage.store.admitted_counts", fails)
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))
    try:
        shard.create_table(TableConfig("emb", 2))
        shard.push("emb", np.arange(10, dtype=np.uint64), np.ones((10, 2), np.float32))
        _, token = shard.hold(60)
        with pytest.raises(OSError, match="Input/output error"):
            shard.save_checkpoint(str(tmp_path / "c" / "new"), token)
        assert not (tmp_path / "c").exists()
        monkeypatch.undo()
        saved = shard.save_checkpoint(str(tmp_path / "c" / "new"), token)
        assert saved["rows"] == {"emb": 10} and (tmp_path / "c" / "new" / "shard-0" / "CURRENT").exists()
    finally:
        shard.close()


def _push_in_flight(gate) -> tuple[threading.Event, threading.Thread]:
    """A push inside gate's push_gate until the returned event is set."""
    entered, done = threading.Event(), threading.Event()

    def push() -> None:
        with gate.push_gate():
            entered.set()
            done.wait(60)

    thread = threading.Thread(target=push)
    thread.start()
    assert entered.wait(60)
    return done, thread


def _waits_told(gate) -> threading.Event:
    """An event set when a wait on gate's condition begins (a hold waiting for the pushes in flight)."""
    waiting, wait = threading.Event(), gate._gate.wait

    def told(timeout=None):
        waiting.set()
        return wait(timeout)

    gate._gate.wait = told
    return waiting


def test_a_holds_expiry_counts_from_the_end_of_its_wait_for_the_pushes_in_flight(monkeypatch):
    """The hold waits for a push in flight past what would be its whole timeout: it is handed back whole (pushes are
    refused after it, for timeout_s from then), not expired."""
    now = [1000.0]
    monkeypatch.setattr(hold_module.time, "monotonic", lambda: now[0])
    gate = PushHold(0)
    done, pushing = _push_in_flight(gate)
    waiting, got = _waits_told(gate), []
    holder = threading.Thread(target=lambda: got.append(gate.hold(10, lambda: 7)))
    holder.start()
    assert waiting.wait(60)
    now[0] += 100  # the push runs on, past the hold's 10 s
    with pytest.raises(CheckpointInProgressError):  # refused while the hold waits
        gate.push_gate().__enter__()
    done.set()
    pushing.join(60)
    holder.join(60)
    assert got and got[0][0] == 7 and gate.held_until == now[0] + 10
    with pytest.raises(CheckpointInProgressError):
        gate.push_gate().__enter__()


def test_a_hold_whose_caller_left_while_it_waited_is_dropped():
    """The hold waits for a push in flight, untimed: its caller's leaving wakes it (no poll), and it is dropped."""
    gate = PushHold(0)
    done, pushing = _push_in_flight(gate)
    caller, failed, timeouts = StandInCaller(), [], []
    waiting, wait = _waits_told(gate), gate._gate.wait
    gate._gate.wait = lambda timeout=None: timeouts.append(timeout) or wait(timeout)

    def take() -> None:
        try:
            gate.hold(60, lambda: 0, caller_gone=caller)
        except CallerGoneError as e:
            failed.append(e)

    holder = threading.Thread(target=take)
    holder.start()
    assert waiting.wait(60)
    caller.leave()
    holder.join(60)
    assert timeouts and set(timeouts) == {None} and len(caller.wakes) == 1  # woken by the watch, not a poll
    assert failed and "its caller left" in str(failed[0]) and gate.token is None and not gate.held_until
    done.set()
    pushing.join(60)
    with gate.push_gate():  # taken: nothing holds the shard
        pass
    assert gate.hold(60, lambda: 0)[1]  # nor keeps another hold out


def test_a_hold_whose_caller_left_before_it_was_handed_back_is_dropped():
    gate = PushHold(0)
    with pytest.raises(CallerGoneError):
        gate.hold(60, lambda: 0, caller_gone=lambda: True)
    assert gate.token is None and not gate.held_until
    with gate.push_gate():
        pass
