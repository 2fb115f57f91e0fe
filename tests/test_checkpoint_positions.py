"""A checkpoint saved with --record-positions (a training run's --resume-file) records each worker's training position, read just before the save holds
the shards (worker/resume_checkpoint.py); a `train --resume-file` on servers restored from it is refused (the file is
another model's position) with the --skip-examples that trains on from the checkpoint, and that command trains the
rest of the stream."""

from __future__ import annotations

import json
import re
import types

import pytest

from ps.checkpoint import load_manifest, write_manifest
from ps.errors import StorageError
from ps.server import Server
from ps.server_config import ServerConfig
from tests.test_resume_file import BATCH, FLAGS, ROWS, interrupt_after, run
from worker.__main__ import main as worker_main
from worker.checkpoint import save
from worker.client import Client
from worker.resume_checkpoint import check_resumed_model, check_same_model, read_positions, restored_position_words
from worker.resume_settings import RECORDED_LATER


def _server(tmp_path, name: str, restore: str | None = None) -> Server:
    server = Server(ServerConfig(data_dir=str(tmp_path / name), port=0, checkpoint_root=str(tmp_path / "root"),
                                 restore_dir=restore))  # fmt: skip
    server.start()
    return server


def test_a_checkpoint_records_the_position_and_a_resume_on_servers_restored_from_it_is_told_its_skip_examples(
    tmp_path, capsys, monkeypatch
):
    position, root = tmp_path / "position.json", tmp_path / "root"
    server = _server(tmp_path, "d0")
    try:
        address = f"127.0.0.1:{server.port}"
        train = ["train", "--servers", address, "--resume-file", str(position), *FLAGS]
        interrupt_after(monkeypatch, 3)
        assert run(train, capsys)[0] == 130
        monkeypatch.undo()
        saved = ["checkpoint", "save", "--servers", address, "--record-positions", str(position)]
        code, out, err = run([*saved[:2], str(root / "c"), *saved[2:]], capsys)
        assert code == 0 and (f"positions recorded (worker 0 at {3 * BATCH:,} examples): a run on servers restored "
                              f"from it trains on with --skip-examples {3 * BATCH}") in out, err  # fmt: skip
        assert run(["checkpoint", "save", str(root / "bare"), "--servers", address], capsys)[0] == 0
        interrupt_after(monkeypatch, 2)  # trained on after the save, and stopped again
        assert run(train, capsys)[0] == 130
        monkeypatch.undo()
        assert json.loads(position.read_text())["examples"] == 5 * BATCH
    finally:
        server.stop(grace_s=1)
    (recorded,) = load_manifest(str(root / "c"))["positions"]
    assert (recorded["examples"], recorded["trained"], recorded["worker_id"]) == (3 * BATCH, False, 0)
    assert "positions" not in load_manifest(str(root / "bare"))
    restored = _server(tmp_path, "d1", restore=str(root / "c"))
    try:
        train[2] = f"127.0.0.1:{restored.port}"
        code, out, err = run([*saved[:2], str(root / "other"), saved[2], train[2], *saved[4:]], capsys)
        assert code == 2 and (f"--resume-file {position} holds the position of a model these servers do not hold "
                              "(") in err and err.rstrip().endswith("; nothing was saved"), err  # fmt: skip
        assert not (root / "other").exists()
        code, out, err = run(train, capsys)
        assert code == 2 and "trained lr" not in out, err
        assert (f"The servers were restored from checkpoint {root / 'c'}, saved at {3 * BATCH:,} examples of this "
                f"worker's run: to train on from it, remove {position} and run the same command with --skip-examples "
                f"{3 * BATCH}\n") in err, err  # fmt: skip
        position.unlink()
        code, out, err = run([*train, "--skip-examples", str(3 * BATCH)], capsys)
        assert code == 0 and re.search(rf"trained lr .* on {ROWS - 3 * BATCH:,} examples", out), out + err
        bare = types.SimpleNamespace(restored_from=str(root / "bare"), restored_sha256=load_manifest(str(root / "bare"))["sha256"])  # fmt: skip
        run_settings = recorded["run"]
        assert "which records no usable position of" in restored_position_words(str(position), run_settings, [bare])
        with Client([train[2]]) as client:
            assert restored_position_words(str(position), run_settings, client.stats()).startswith(
                f"The servers were restored from checkpoint {root / 'c'}, saved at"
            )
    finally:
        restored.stop(grace_s=1)


def test_a_jobs_positions_name_its_fewest_and_a_trained_one_nothing_to_train_on(tmp_path):
    """The manifest of a checkpoint of a job's 2 workers, and of one whose training was over: the words for
    worker 0 (a manifest's positions are what read_positions recorded; its shards are not read here)."""
    run_settings = {"worker_id": 0, "num_workers": 2, "libsvm_values": "auto"}
    positions = [{"resume_file": str(tmp_path / f"p{i}.json"), "worker_id": i, "num_workers": 2, "examples": n,
                  "trained": False, "run": {**run_settings, "worker_id": i}} for i, n in ((0, 1500), (1, 1000))]  # fmt: skip
    manifest = {"format": 1, "num_shards": 1, "num_slots": load_slots(), "clock": 0, "tables": [],
                "shards": [{"shard_id": 0, "dir": "shard-0", "clock": 0, "rows": {}, "files": {}}]}  # fmt: skip
    for name, trained in (("job", False), ("over", True)):
        (tmp_path / name).mkdir()
        written = write_manifest(str(tmp_path / name), {**manifest, "positions": [{**p, "trained": trained} for p in positions]})  # fmt: skip
        stats = [types.SimpleNamespace(restored_from=str(tmp_path / name), restored_sha256=written["sha256"])]
        words = restored_position_words(str(tmp_path / "p0.json"), run_settings, stats)
        if trained:
            assert "saved once this worker's training was over (1,500 examples): there is nothing to train" in words
        else:
            assert words.endswith(f"remove each worker's FILE ({tmp_path / 'p{worker}.json'}) and run the same "
                                  "command with --skip-examples 1500 (a job's workers, given one value by ps-worker "
                                  "launch: --skip-examples 1000, the fewest of its 2 recorded)"), words  # fmt: skip
        assert restored_position_words(str(tmp_path / "p0.json"), {**run_settings, "epochs": 2}, stats).startswith(
            f"The servers were restored from checkpoint {tmp_path / name}, which records no usable position of"
        )
    other = [types.SimpleNamespace(restored_from="", restored_sha256="")]
    assert restored_position_words(str(tmp_path / "p0.json"), run_settings, [*stats, *other]) == ""


def test_the_resumed_model_check_refuses_other_state_ids_adding_the_checkpoints_skip_examples(tmp_path):
    """check_resumed_model, the one check of a resumed run and of a finished worker's rerun: the same ids (or none
    recorded) pass; a shard's other id is a ValueError naming it, followed by the --skip-examples of the checkpoint
    the shards were restored from, where it records this worker's position."""
    run_settings = {"worker_id": 0, "num_workers": 1, **RECORDED_LATER}
    resume_file = str(tmp_path / "p0.json")
    position = {"resume_file": resume_file, "worker_id": 0, "num_workers": 1, "examples": 700, "trained": False,
                "run": run_settings}  # fmt: skip
    manifest = {"format": 1, "num_shards": 1, "num_slots": load_slots(), "clock": 0, "tables": [], "positions": [position],
                "shards": [{"shard_id": 0, "dir": "shard-0", "clock": 0, "rows": {}, "files": {}}]}  # fmt: skip
    (tmp_path / "ckpt").mkdir()
    written = write_manifest(str(tmp_path / "ckpt"), manifest)
    stats = [types.SimpleNamespace(restored_from=str(tmp_path / "ckpt"), restored_sha256=written["sha256"])]
    client = types.SimpleNamespace(state_ids=(7,), servers=["127.0.0.1:5000"])
    check_resumed_model(resume_file, (7,), client, run_settings, stats)
    check_resumed_model(resume_file, (), client, run_settings, stats)
    with pytest.raises(ValueError) as refused:
        check_resumed_model(resume_file, (3,), client, run_settings, stats)
    message = str(refused.value)
    assert message.startswith(f"--resume-file {resume_file} holds the position of a model the servers no longer "
                              "hold: shard 0 (127.0.0.1:5000) was restored"), message  # fmt: skip
    assert message.endswith(f"remove {resume_file} and run the same command with --skip-examples 700"), message
    bare = [types.SimpleNamespace(restored_from="", restored_sha256="")]
    with pytest.raises(ValueError, match=r"since it was written; .*remove the file to train from the start$"):
        check_resumed_model(resume_file, (3,), client, run_settings, bare)  # no restore to name: state_changed's words


def load_slots() -> int:
    from ps.sharding import NUM_SLOTS

    return NUM_SLOTS


def test_the_positions_are_read_before_any_shard_is_held(tmp_path, monkeypatch):
    root = tmp_path / "root"
    servers = [Server(ServerConfig(data_dir=str(tmp_path / f"d{i}"), port=0, shard_id=i, num_shards=2,
                                   checkpoint_root=str(root))) for i in range(2)]  # fmt: skip
    try:
        addresses = [f"127.0.0.1:{s.start()}" for s in servers]
        calls: list[str] = []
        real = Client.checkpoint

        def checkpoint(self, requests):
            calls.extend(f"{r.phase} {s}" for s, r in sorted(requests.items()))
            return real(self, requests)

        monkeypatch.setattr(Client, "checkpoint", checkpoint)
        with Client(addresses) as client:
            client.wait_ready()
            manifest = save(client, str(root / "c"), positions=lambda: calls.append("read") or [{"examples": 7}])
        assert calls == ["read", "hold 0", "hold 1", "save 0", "save 1", "release 0", "release 1"], calls
        assert manifest["positions"] == [{"examples": 7}] == load_manifest(str(root / "c"))["positions"]
    finally:
        for s in servers:
            s.stop(grace_s=1)


def test_a_workers_template_reads_each_workers_file_and_a_missing_one_saves_nothing(tmp_path, capsys):
    for i, n in ((0, 1500), (1, 1000)):
        record = {"format": 1, "run": {"worker_id": i, "num_workers": 2}, "started_from": 0, "examples": n,
                  "trained": False, "finished": False}  # fmt: skip
        (tmp_path / f"p{i}.json").write_text(json.dumps(record))
    read = read_positions(str(tmp_path / "p{worker}.json"))
    assert [(p["worker_id"], p["examples"], p["resume_file"]) for p in read] == [
        (0, 1500, str(tmp_path / "p0.json")), (1, 1000, str(tmp_path / "p1.json"))]  # fmt: skip
    check_same_model(read, (), ["a:1"])  # files without state ids, servers not read: not known, taken
    same = [{**p, "state_ids": [5, 6]} for p in read]
    check_same_model(same, (5, 6), ["a:1", "b:1"])
    with pytest.raises(ValueError, match=rf"--resume-file {tmp_path / 'p0.json'} holds the position of a model"):
        check_same_model(same, (5, 7), ["a:1", "b:1"])
    (tmp_path / "p1.json").unlink()
    with pytest.raises(ValueError, match=rf"--resume-file {tmp_path / 'p1.json'} does not exist"):
        read_positions(str(tmp_path / "p{worker}.json"))
    (tmp_path / "p0.json").write_text('{"format": 1, "examples": -3}')
    with pytest.raises(ValueError, match="is no position a training run wrote"):
        read_positions(str(tmp_path / "p0.json"))
    argv = ["checkpoint", "save", str(tmp_path / "c"), "--servers", "127.0.0.1:1", "--record-positions"]
    code = worker_main([*argv, str(tmp_path / "p{worker}.json")])
    err = capsys.readouterr().err
    assert code == 2 and "is no position a training run wrote" in err and err.rstrip().endswith("; nothing was saved")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    "change, damage",
    [
        ({"num_workers": None}, "in entry 0, a position without num_workers"),
        ({"examples": "many"}, "in entry 0, examples 'many', expected an integer >= 0"),
        ({"examples": -7}, "in entry 0, examples -7, expected an integer >= 0"),
        ({"worker_id": 2}, "in entry 0, worker_id 2 of num_workers 2, expected one below it"),
    ],
)
def test_a_damaged_position_in_the_manifest_is_no_usable_position_and_gives_no_skip_examples(tmp_path, change, damage):
    run_settings = {"worker_id": 0, "num_workers": 2, "libsvm_values": "auto"}
    position = {"resume_file": str(tmp_path / "p0.json"), "worker_id": 0, "num_workers": 2, "examples": 1500,
                "trained": False, "run": run_settings}  # fmt: skip
    damaged = {k: v for k, v in {**position, **change}.items() if v is not None}
    (tmp_path / "c").mkdir()
    written = write_manifest(str(tmp_path / "c"), {**_bare_manifest(), "positions": [damaged]})
    stats = [types.SimpleNamespace(restored_from=str(tmp_path / "c"), restored_sha256=written["sha256"])]
    words = restored_position_words(str(tmp_path / "p0.json"), run_settings, stats)
    assert words == (f"The servers were restored from checkpoint {tmp_path / 'c'}, which records no usable position "
                     f"of {tmp_path / 'p0.json'} under these settings (its positions key is damaged: {damage}): take "
                     "the count from FILE's `examples` where the run had stopped before the save, or from the "
                     "progress the run printed"), words  # fmt: skip


@pytest.mark.parametrize("positions", [5, [5], {"resume_file": "p0.json"}])
def test_a_manifest_whose_positions_are_no_list_of_objects_is_refused_and_gives_no_words(tmp_path, positions):
    written = write_manifest(str(tmp_path), {**_bare_manifest(), "positions": positions})
    with pytest.raises(StorageError, match=r"has positions .*, expected a list of objects; the checkpoint is damaged"):
        load_manifest(str(tmp_path))
    stats = [types.SimpleNamespace(restored_from=str(tmp_path), restored_sha256=written["sha256"])]
    assert restored_position_words(str(tmp_path / "p0.json"), {"worker_id": 0, "num_workers": 1}, stats) == ""


def _bare_manifest() -> dict:
    """A manifest of one shard holding no table, without positions and sha256 (write_manifest adds it)."""
    return {"format": 1, "num_shards": 1, "num_slots": load_slots(), "clock": 0, "tables": [],
            "shards": [{"shard_id": 0, "dir": "shard-0", "clock": 0, "rows": {}, "files": {}}]}  # fmt: skip


@pytest.mark.parametrize("worker_1", [(3, 4), (1, 3), (0, 2)])
def test_a_workers_template_whose_files_are_of_two_jobs_saves_nothing(tmp_path, capsys, worker_1):
    for i, (worker_id, num_workers) in enumerate([(0, 2), worker_1]):
        record = {"format": 1, "run": {"worker_id": worker_id, "num_workers": num_workers}, "started_from": 0,
                  "examples": 1000, "trained": False, "finished": False}  # fmt: skip
        (tmp_path / f"p{i}.json").write_text(json.dumps(record))
    expected = (f"--resume-file {tmp_path / 'p1.json'} holds the position of worker {worker_1[0]} of {worker_1[1]}, "
                f"expected worker 1 of 2 (as {tmp_path / 'p0.json'} ran with): each {{worker}} file must be of one job")  # fmt: skip
    with pytest.raises(ValueError) as refused:
        read_positions(str(tmp_path / "p{worker}.json"))
    assert str(refused.value) == expected
    argv = ["checkpoint", "save", str(tmp_path / "c"), "--servers", "127.0.0.1:1", "--record-positions"]
    assert worker_main([*argv, str(tmp_path / "p{worker}.json")]) == 2
    assert f"{expected}; nothing was saved" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_a_jobs_files_are_named_by_their_template_or_else_each_one():
    from worker.resume_checkpoint import _files_template

    def job(*paths):
        return [{"worker_id": i, "resume_file": path} for i, path in enumerate(paths)]

    assert _files_template(job(*(f"/d/w{i}/p.json" for i in range(12)))) == "/d/w{worker}/p.json"
    assert _files_template(job("/d/a.json", "/d/b.json")) == "/d/a.json, /d/b.json"
    assert _files_template(job("/d/p0-0.json", "/d/p1-1.json")) == "/d/p0-0.json, /d/p1-1.json"
