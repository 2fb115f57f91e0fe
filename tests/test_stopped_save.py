"""A Ctrl-C (or SIGTERM) that stops `ps-worker checkpoint save` or `ps-worker export` ends with a line that says
what it left, from what the command knew as it stopped: what the checkpoint directory (or OUT) holds, and whether
the servers take pushes again. The signal is raised at a chosen point of the real command (the client's Checkpoint
call, the export's `ps-server export`), as a Ctrl-C there raises KeyboardInterrupt in the main thread."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ps.checkpoint import load_manifest
from ps.config import TableConfig
from ps.errors import PsError
from ps.server import Server
from ps.server_config import ServerConfig
from worker.__main__ import main
from worker.checkpoint import save
from worker.client import Client

TIMEOUT_S = 30
HOLD_S = 60  # the saves' --hold-timeout-s: a hold kept outlasts any push a test sends after it


@pytest.fixture
def two_shards(tmp_path):
    """(addresses, root): two shards with --checkpoint-root root, a table emb of 100 rows trained on both."""
    root = tmp_path / "root"
    servers = [Server(ServerConfig(data_dir=str(tmp_path / f"d{i}"), port=0, shard_id=i, num_shards=2,
                                   checkpoint_root=str(root))) for i in range(2)]  # fmt: skip
    try:
        addresses = [f"127.0.0.1:{s.start()}" for s in servers]
        with Client(addresses) as client:
            client.create_table(TableConfig(name="emb", dim=2))
            client.push("emb", np.arange(100, dtype=np.uint64), np.ones((100, 2), np.float32))
        yield addresses, root
    finally:
        for s in servers:
            s.stop(grace_s=1)


def _stop_at(monkeypatch, phase: str, after_sending: bool, shard: int | None = None, release_fails: bool = False,
             release_stopped: bool = False):  # fmt: skip
    """Client.checkpoint raises KeyboardInterrupt at the first request of `phase` (to `shard`, where given): after
    the real call where after_sending, else in its place; release_fails: a release then raises PsError, sent;
    release_stopped: a release then raises KeyboardInterrupt (a second Ctrl-C), not sent."""
    real = Client.checkpoint
    fired = []

    def checkpoint(self, requests):
        phases = {r.phase for r in requests.values()}
        if fired and release_fails and "release" in phases:
            real(self, requests)
            raise PsError("the release did not answer")
        if fired and release_stopped and "release" in phases:
            raise KeyboardInterrupt
        if not fired and phase in phases and (shard is None or shard in requests):
            fired.append(True)
            if after_sending:
                real(self, requests)
            raise KeyboardInterrupt
        return real(self, requests)

    monkeypatch.setattr(Client, "checkpoint", checkpoint)


def _save(addresses, target, capsys) -> tuple[int, str]:
    """`ps-worker checkpoint save target`'s exit code and the last line of its stderr."""
    code = main(["checkpoint", "save", str(target), "--servers", ",".join(addresses), "--hold-timeout-s", str(HOLD_S)])
    return code, capsys.readouterr().err.strip().splitlines()[-1]


def _pushes_taken(addresses) -> None:
    """A push is applied on both shards (one whose hold was kept would refuse it until its hold times out)."""
    with Client(addresses, timeout_s=2, server_timeout_s=0) as client:
        client.push("emb", np.arange(100, dtype=np.uint64), np.ones((100, 2), np.float32))


def _ctrl_c() -> BaseException:
    return KeyboardInterrupt()  # after the release, as the manifest's table configs are read


def _wrapped_ctrl_c() -> BaseException:  # as numba's compiled code turns a Ctrl-C inside it into a SystemError
    error = SystemError("error return without exception set")
    error.__cause__ = KeyboardInterrupt()
    return error


@pytest.mark.parametrize("stop", [_ctrl_c, _wrapped_ctrl_c], ids=["ctrl-c", "ctrl-c wrapped in another error"])
def test_a_stop_as_every_shard_saved_says_the_parts_are_no_checkpoint_and_the_pushes_go_on(
    two_shards, capsys, monkeypatch, stop
):
    """A stop once every shard saved its part, before the manifest, plain or carried by another error (the note
    goes on the signal behind it, where exit_code reads it): the parts are named as no checkpoint, the hold as
    released, and pushes go on."""
    addresses, root = two_shards

    def stopped(*args):
        raise stop()

    monkeypatch.setattr(Client, "describe_table", stopped)
    code, last = _save(addresses, root / "c", capsys)
    assert code == 130 and last == (
        f"ps-worker: interrupted: every shard saved its part into {root / 'c'}. No manifest.json was written, so "
        f"the shard-<i> folders there are not a checkpoint: delete {root / 'c'} before saving into it again. The "
        "hold of shards 0, 1 was released: pushes are taken there again."
    ), last
    assert sorted(os.listdir(root / "c")) == ["shard-0", "shard-1"]
    monkeypatch.undo()
    _pushes_taken(addresses)


def test_a_stop_while_the_shards_save_names_the_parts_and_a_failed_release_says_pushes_are_refused(
    two_shards, capsys, monkeypatch
):
    addresses, root = two_shards
    _stop_at(monkeypatch, "save", after_sending=True, release_fails=True)
    code, last = _save(addresses, root / "c", capsys)
    assert code == 130 and last == (
        f"ps-worker: interrupted: the save was stopped while the shards saved. {root / 'c'} holds shard-0, shard-1, "
        "the part of each shard whose save finished; a shard whose save did not answer may still write its part "
        "there; with no manifest.json it is not a checkpoint: delete it once the shards are done, before saving into "
        "it again. The release of the hold of shards 0, 1 failed (the release did not answer): each refuses pushes until its "
        f"hold times out, {HOLD_S} s after it was taken."
    ), last


def test_a_stop_before_the_save_phase_says_nothing_was_written_and_names_the_hold_that_did_not_answer(
    two_shards, capsys, monkeypatch
):
    addresses, root = two_shards
    _stop_at(monkeypatch, "hold", after_sending=False, shard=1)
    code, last = _save(addresses, root / "c", capsys)
    assert code == 130 and last == (
        f"ps-worker: interrupted: no shard was asked to save: nothing was written into {root / 'c'}. The hold of "
        "shard 0 was released: pushes are taken there again. No answer came to the hold sent to shard 1: where it "
        f"took, each refuses pushes until its hold times out, {HOLD_S} s after it was taken."
    ), last
    assert not (root / "c").exists()
    monkeypatch.undo()
    _pushes_taken(addresses)  # shard 1's hold was never sent


def test_a_stop_of_an_export_after_its_new_files_are_in_place_says_the_export_is_in_place(
    two_shards, capsys, monkeypatch
):
    import worker.export

    addresses, root = two_shards
    out, real_run = root / "out", worker.export._run_server_export

    def then_stopped(command, claim):
        assert real_run(command, claim) == 0
        raise KeyboardInterrupt  # as a Ctrl-C that comes as `ps-server export` ends (its files in place)

    monkeypatch.setattr(worker.export, "_run_server_export", then_stopped)
    code = main(["export", str(out), "--servers", ",".join(addresses), "--no-progress"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    placed = json.loads((out / "export.json").read_text())["dir"]
    assert code == 130 and last == (
        f"ps-worker: interrupted: the new export is in place ({out / 'export.json'} names {placed}); the next export "
        "into it removes any files `ps-server export` left there. The servers' hold ended with the save of its "
        "checkpoint: they take pushes."
    ), last
    assert sorted(os.listdir(out)) == sorted([placed, "export.json"])


def test_a_stop_of_an_export_in_its_save_says_its_checkpoint_was_removed_and_out_is_as_it_was(
    two_shards, capsys, monkeypatch
):
    addresses, root = two_shards
    out = root / "out"
    assert main(["export", str(out), "--servers", ",".join(addresses), "--no-progress"]) == 0
    before = sorted(os.listdir(out))
    earlier = json.loads((out / "export.json").read_text())["dir"]
    _stop_at(monkeypatch, "save", after_sending=True)
    code = main(["export", str(out), "--servers", ",".join(addresses), "--no-progress", "--overwrite"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 130 and last.startswith(
        f"ps-worker: interrupted: nothing was exported: {out / 'export.json'} names {earlier}, the export it named "
        f"before. Its fresh checkpoint {out}/checkpoint.new-"
    ), last
    assert last.endswith(" was removed. The hold of shards 0, 1 was released: pushes are taken there again."), last
    assert sorted(os.listdir(out)) == before


def _pushes_refused(addresses) -> None:
    """A push is refused: a shard still holds its hold (taken with --hold-timeout-s HOLD_S: long enough that a
    loaded machine cannot see it time out before this push lands)."""
    with Client(addresses, timeout_s=2, server_timeout_s=0) as client, pytest.raises(PsError):
        client.push("emb", np.arange(100, dtype=np.uint64), np.ones((100, 2), np.float32))


CUT_OFF = ("The release of the hold of shards 0, 1 was cut off before it answered: each shard it did not reach "
           f"refuses pushes until its hold times out, {HOLD_S} s after it was taken.")  # fmt: skip


def test_a_stop_in_the_final_release_says_it_was_cut_off_and_the_shards_refuse_pushes(two_shards, capsys, monkeypatch):
    addresses, root = two_shards
    _stop_at(monkeypatch, "release", after_sending=False)
    code, last = _save(addresses, root / "c", capsys)
    assert code == 130 and last == (
        f"ps-worker: interrupted: every shard saved its part into {root / 'c'}. No manifest.json was written, so "
        f"the shard-<i> folders there are not a checkpoint: delete {root / 'c'} before saving into it again. {CUT_OFF}"
    ), last
    monkeypatch.undo()
    _pushes_refused(addresses)


def test_a_second_stop_in_the_release_after_a_stop_says_it_was_cut_off(two_shards, capsys, monkeypatch):
    addresses, root = two_shards
    _stop_at(monkeypatch, "save", after_sending=True, release_stopped=True)
    code, last = _save(addresses, root / "c", capsys)
    assert code == 130 and last.startswith("ps-worker: interrupted: the save was stopped while the shards saved. "), (
        last
    )
    assert last.endswith(f"it again. {CUT_OFF}"), last
    monkeypatch.undo()
    _pushes_refused(addresses)


def test_a_stop_once_the_manifest_is_in_place_says_the_checkpoint_is_whole(two_shards, capsys, monkeypatch):
    import worker.checkpoint

    addresses, root = two_shards
    real = worker.checkpoint.write_manifest

    def then_stopped(directory, manifest):
        real(directory, manifest)
        raise KeyboardInterrupt  # as a Ctrl-C during the fsync of the directory, after the rename

    monkeypatch.setattr(worker.checkpoint, "write_manifest", then_stopped)
    code, last = _save(addresses, root / "c", capsys)
    assert code == 130 and last == (
        f"ps-worker: interrupted: the checkpoint {root / 'c'} is whole: its manifest.json was written. The hold of "
        "shards 0, 1 was released: pushes are taken there again."
    ), last
    assert load_manifest(str(root / "c"))["num_shards"] == 2


def _export_twice_stopped(addresses, out, capsys, stop) -> tuple[int, str, str]:
    """(exit code, last stderr line, the earlier export's folder) of an export into out over an earlier one, with
    stop() run as the second one begins."""
    assert main(["export", str(out), "--servers", ",".join(addresses), "--no-progress"]) == 0
    earlier = json.loads((out / "export.json").read_text())["dir"]
    stop()
    code = main(["export", str(out), "--servers", ",".join(addresses), "--no-progress", "--overwrite"])
    return code, capsys.readouterr().err.strip().splitlines()[-1], earlier


def test_a_stop_of_an_export_before_it_reads_the_earlier_one_says_nothing_was_exported(two_shards, capsys, monkeypatch):
    import sys

    from ps.storage import leftovers

    addresses, root = two_shards
    out, real = root / "out", leftovers.export_in_place

    def stopped(folder):
        if sys._getframe(1).f_code.co_name == "export_command":  # its read of the export in place as it begins
            raise KeyboardInterrupt
        return real(folder)

    code, last, earlier = _export_twice_stopped(
        addresses, out, capsys, lambda: monkeypatch.setattr(leftovers, "export_in_place", stopped)
    )
    assert code == 130 and last == (
        f"ps-worker: interrupted: nothing was exported: {out / 'export.json'} names {earlier}, the export it named "
        "before. No shard was held: the servers took pushes throughout."
    ), last


def test_a_stop_of_an_export_as_its_client_closes_after_the_save_says_the_hold_ended(two_shards, capsys, monkeypatch):
    addresses, root = two_shards
    out, real = root / "out", Client.__exit__

    def closed_then_stopped(self, *exc):
        real(self, *exc)
        raise KeyboardInterrupt  # as a Ctrl-C while the client closes, once the save returned

    code, last, earlier = _export_twice_stopped(
        addresses, out, capsys, lambda: monkeypatch.setattr(Client, "__exit__", closed_then_stopped)
    )
    assert code == 130 and last.startswith(
        f"ps-worker: interrupted: nothing was exported: {out / 'export.json'} names {earlier}, the export it named "
        f"before. Its fresh checkpoint {out}/checkpoint.new-"
    ), last
    assert last.endswith(" was removed. The servers' hold ended with the save of its checkpoint: they take pushes."), (
        last
    )


def test_a_stop_as_shard_0_is_held_names_its_hold_that_did_not_answer(two_shards, capsys, monkeypatch):
    addresses, root = two_shards
    _stop_at(monkeypatch, "hold", after_sending=True, shard=0)
    code, last = _save(addresses, root / "c", capsys)
    assert code == 130 and last == (
        f"ps-worker: interrupted: no shard was asked to save: nothing was written into {root / 'c'}. No answer came "
        f"to the hold sent to shard 0: where it took, each refuses pushes until its hold times out, {HOLD_S} s after "
        "it was taken."
    ), last
    monkeypatch.undo()
    _pushes_refused(addresses)  # shard 0 took the hold, whose token never came back


def test_a_stop_as_the_positions_are_read_says_no_shard_was_held(two_shards, monkeypatch):
    addresses, root = two_shards

    def read():
        raise KeyboardInterrupt

    with Client(addresses) as client, pytest.raises(KeyboardInterrupt) as stopped:
        client.wait_ready()
        save(client, str(root / "c"), hold_timeout_s=7, positions=read)
    assert stopped.value.__notes__ == [
        f"no shard was asked to save: nothing was written into {root / 'c'}. No shard was held: the servers took "
        "pushes throughout."
    ]
    _pushes_taken(addresses)
