"""Checkpoints: saved from 2 shards while another table keeps being pushed to, restored onto 1, 2 and 3 shards:
pulls equal the pulls at the cut bit for bit, optimizer state and statistics come along (the same push after
restore gives the same rows as on the original), and a damaged checkpoint is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ps.config import AdmissionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.errors import StorageError
from ps.server import Server
from ps.server_config import ServerConfig
from ps.sharding import SlotMap
from tests.conftest import exported, random_ids
from tests.waiting import join_thread, wait_until
from worker.client import Client

EMB = TableConfig("emb", 8, optimizer=OptimizerConfig("adagrad", 0.1), admission=AdmissionConfig(min_count=2))
DENSE = TableConfig("dense.w", 16, optimizer=OptimizerConfig("adam", 0.01))
BUSY = TableConfig("busy", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0))  # row = -pushes
IDS = random_ids(3000, seed=5)


def start_servers(root, n, restore=None) -> tuple[list[Server], list[str]]:
    servers = []
    for i in range(n):
        config = ServerConfig(data_dir=str(root / f"shard-{i}"), shard_id=i, num_shards=n, port=0, restore_dir=restore,
                              checkpoint_root=str(root.parent))  # fmt: skip
        servers.append(Server(config))
        servers[-1].start()
    return servers, [f"127.0.0.1:{s.port}" for s in servers]


def stop(servers) -> None:
    for s in servers:
        s.stop(grace_s=1)


def pull_all(client) -> dict:
    return {"emb": client.pull("emb", IDS), "dense.w": client.pull("dense.w", np.arange(64, dtype=np.uint64))}


def table_counts(client) -> dict:
    """{table: (rows, pending ids)} summed over the shards."""
    out = {}
    for s in client.stats():
        for t in s.tables:
            rows, pending = out.get(t.name, (0, 0))
            out[t.name] = (rows + t.num_rows, pending + t.pending_ids)
    return out


def more_training(client) -> None:
    rng = np.random.default_rng(9)
    client.push("emb", IDS[:1500], rng.standard_normal((1500, 8)).astype(np.float32))
    client.push("dense.w", np.arange(64, dtype=np.uint64), rng.standard_normal((64, 16)).astype(np.float32))


def test_save_while_pushing_then_restore_onto_1_2_and_3_shards(tmp_path):
    original, addresses = start_servers(tmp_path / "original", 2)
    checkpoint = tmp_path / "ckpt"
    try:
        with Client(addresses, timeout_s=300) as client:  # the suite's first test: its pushes compile the kernels
            for t in (EMB, DENSE, BUSY):
                client.create_table(t)
            rng = np.random.default_rng(0)
            for r in range(3):  # ids 0..999 pushed 3 times (admitted), the rest once (pending: statistics only)
                ids = IDS[: 1000 if r else 3000]
                client.push("emb", ids, rng.standard_normal((len(ids), 8)).astype(np.float32), np.ones(len(ids)))
                client.push("dense.w", np.arange(64, dtype=np.uint64), rng.standard_normal((64, 16)).astype(np.float32))
                client.advance_clock()
            at_cut = pull_all(client)
            stats_at_cut = table_counts(client)
            assert stats_at_cut["emb"] == (1000, 2000)

            stop_pushing, pushed, failed = threading.Event(), [], []

            def keep_pushing():  # another worker trains on while the checkpoint is taken
                try:
                    with Client(addresses, server_timeout_s=60) as other:
                        while not stop_pushing.is_set():
                            other.push("busy", IDS[:200], np.ones((200, 2), np.float32))
                            pushed.append(1)
                except Exception as e:  # reported by the waits below
                    failed.append(e)

            def pushes_reach(n: int) -> bool:
                assert not failed, f"the other worker failed after {len(pushed)} pushes: {failed[0]!r}"
                return len(pushed) >= n

            pusher = threading.Thread(target=keep_pushing)
            pusher.start()
            try:
                wait_until(lambda: pushes_reach(5), 60, lambda: f"5 pushes of the other worker (got {len(pushed)})")
                r = subprocess.run([sys.executable, "-m", "worker", "checkpoint", "save", str(checkpoint), "--servers",
                                    ",".join(addresses)], capture_output=True, text=True, timeout=120)  # fmt: skip
                assert r.returncode == 0, r.stderr
                assert "checkpoint of 2 shards at clock 3" in r.stdout and "emb 1,000 rows" in r.stdout
                n_before = len(pushed)
                wait_until(lambda: pushes_reach(n_before + 5), 60, "5 more pushes after the checkpoint")
            finally:
                stop_pushing.set()
                join_thread(pusher, 60, "the other worker, told to stop")
            assert not failed, failed
            assert sorted(os.listdir(checkpoint)) == ["manifest.json", "shard-0", "shard-1"]
            more_training(client)  # the original moves on: the checkpoint must not
            after_more = pull_all(client)
    finally:
        stop(original)

    for n in (1, 2, 3):
        restored, addresses = start_servers(tmp_path / f"restored-{n}", n, restore=str(checkpoint))
        try:
            with Client(addresses) as client:
                client.wait_ready()
                got = pull_all(client)
                for name in at_cut:
                    np.testing.assert_array_equal(got[name], at_cut[name])  # bit for bit
                assert [s.clock for s in client.stats()] == [3] * n
                counts = table_counts(client)
                assert counts["emb"] == stats_at_cut["emb"] and counts["dense.w"] == stats_at_cut["dense.w"]
                busy = client.pull("busy", IDS[:200])
                owner = SlotMap.contiguous(2).shard_of(IDS[:200])
                for old_shard in (0, 1):  # each original shard's rows hold the same whole number of pushes
                    values = set(busy[owner == old_shard].ravel().tolist())
                    assert len(values) == 1 and 5 <= -values.pop() <= n_before + 1
                more_training(client)  # the same push on the restored state: optimizer state came along
                for name in after_more:
                    np.testing.assert_array_equal(pull_all(client)[name], after_more[name])
        finally:
            stop(restored)


def busy_checkpoint(tmp_path, while_up=None) -> None:
    """One shard (data in tmp_path/original) with table busy, 100 ids pushed once, saved to tmp_path/ckpt, then
    stopped; while_up(client, save) runs before the stop."""
    from worker.checkpoint import save

    original, addresses = start_servers(tmp_path / "original", 1)
    try:
        with Client(addresses) as client:
            client.create_table(BUSY)
            client.push("busy", IDS[:100], np.ones((100, 2), np.float32))
            save(client, str(tmp_path / "ckpt"))
            if while_up is not None:
                while_up(client, save)
    finally:
        stop(original)


def test_a_damaged_or_missing_checkpoint_is_refused(tmp_path):
    def save_again(client, save):
        with pytest.raises(ValueError, match="holds a checkpoint already"):
            save(client, str(tmp_path / "ckpt"))

    busy_checkpoint(tmp_path, save_again)
    shard_dir = tmp_path / "ckpt" / "shard-0"
    sst = sorted(p for p in os.listdir(shard_dir) if p.endswith(".sst"))[0]
    with open(shard_dir / sst, "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xff")
    with pytest.raises(StorageError, match=rf"shard-0/{sst} does not match its checksum.*data dir was not touched"):
        Server(ServerConfig(data_dir=str(tmp_path / "r"), restore_dir=str(tmp_path / "ckpt")))
    assert not (tmp_path / "r").exists()  # checked before the data dir is made: no empty shard left to start on
    with pytest.raises(StorageError, match="is not a checkpoint: .* the data dir was not touched"):
        Server(ServerConfig(data_dir=str(tmp_path / "r2"), restore_dir=str(tmp_path)))
    assert not (tmp_path / "r2").exists()
    from ps.engine.shard import Shard

    started = tmp_path / "started"  # a shard's dir without tables: the checkpoint is checked in restore_into
    Shard(ServerConfig(data_dir=str(started))).close()
    with pytest.raises(StorageError, match=rf"shard-0/{sst} does not match its checksum"):
        Server(ServerConfig(data_dir=str(started), restore_dir=str(tmp_path / "ckpt")))
    Shard(ServerConfig(data_dir=str(started))).close()  # no restore mark left: the dir is usable
    other = tmp_path / "other"  # another tool's manifest.json beside a data dir named shard-0
    (other / "shard-0").mkdir(parents=True)
    (other / "manifest.json").write_text('{"files": ["a"]}')
    Shard(ServerConfig(data_dir=str(other / "shard-0"))).close()


def files_of(root) -> dict:
    """{relative path: (size, mtime_ns, bytes)} of every file under root."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            full = os.path.join(folder, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, root)] = (os.path.getsize(full), os.stat(full).st_mtime_ns, f.read())
    return out


def test_restore_export_and_verify_write_nothing_into_what_they_read(tmp_path):
    """rocksdict writes a file at every open, read-only ones too: a checkpoint on a read-only disk could not be
    read, and one read by another rocksdict version would fail its own checksums."""
    from ps.engine.export import export
    from ps.engine.shard import Shard
    from ps.storage.verify import verify_data_dir

    busy_checkpoint(tmp_path)
    checkpoint, data_dir = tmp_path / "ckpt", tmp_path / "original" / "shard-0"
    before, data_before = files_of(checkpoint), files_of(data_dir)
    Shard(ServerConfig(data_dir=str(tmp_path / "r"), restore_dir=str(checkpoint))).close()
    export(str(checkpoint), str(tmp_path / "out"))
    report, damaged = verify_data_dir(str(data_dir))
    assert not damaged, report
    with pytest.raises(StorageError, match=r"ckpt/shard-0 is a shard's folder of the checkpoint .*ckpt, not a data "
                                           r"dir: a server on it would change the checkpoint. .*--restore"):  # fmt: skip
        Shard(ServerConfig(data_dir=str(checkpoint / "shard-0")))
    for what in (checkpoint, checkpoint / "shard-0"):  # verified as a checkpoint, or one shard's folder of it
        report, damaged = verify_data_dir(str(what))
        assert not damaged and report[-1] == f"verify checkpoint {what}: nothing damaged", report
    assert files_of(checkpoint) == before and files_of(data_dir) == data_before
    assert exported(tmp_path / "out", "busy")[1].sum() == -200
    again = [sys.executable, "-m", "ps", "export", str(checkpoint), "--out", str(tmp_path / "out")]
    refused = subprocess.run(again, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "holds an earlier export (export.json)" in refused.stderr, refused.stderr
    assert subprocess.run([*again, "--overwrite"], capture_output=True, timeout=120).returncode == 0


@pytest.mark.parametrize("restore", [True, False])
def test_a_data_dir_inside_a_checkpoints_shard_folder_is_refused_and_the_checkpoint_stays_whole(tmp_path, restore):
    """A data dir made inside shard-<i> would add files there, which every later restore, export and verify of the
    checkpoint refuses as damage; refused before anything is written."""
    from ps.engine.shard import Shard
    from ps.storage.verify import verify_data_dir

    busy_checkpoint(tmp_path)
    checkpoint = tmp_path / "ckpt"
    before = files_of(checkpoint)
    data_dir = checkpoint / "shard-0" / "restored" / "here"
    with pytest.raises(StorageError, match=r"--data-dir .*restored/here lies inside .*ckpt/shard-0, a shard's folder "
                                           r"of the checkpoint .*ckpt: .*nothing was changed"):  # fmt: skip
        Shard(ServerConfig(data_dir=str(data_dir), restore_dir=str(checkpoint) if restore else None))
    assert files_of(checkpoint) == before and not (checkpoint / "shard-0" / "restored").exists()
    report, damaged = verify_data_dir(str(checkpoint))
    assert not damaged, report


def test_a_data_dir_that_reaches_a_checkpoints_shard_folder_by_a_link_or_relative_path_is_refused(
    tmp_path, monkeypatch
):
    """A symbolic link on the way, or a path relative to the working directory, leads into shard-<i> all the same:
    refused as the plain path is, the checkpoint untouched."""
    from ps.engine.shard import Shard

    busy_checkpoint(tmp_path)
    checkpoint = tmp_path / "ckpt"
    before = files_of(checkpoint)
    (tmp_path / "to-shard").symlink_to(checkpoint / "shard-0")
    inside = r"lies inside .*ckpt/shard-0, a shard's folder of the checkpoint .*ckpt: .*nothing was changed"
    monkeypatch.chdir(checkpoint)
    for data_dir, said in [
        (tmp_path / "to-shard" / "here", inside),
        ("shard-0/here", inside),
        (tmp_path / "to-shard", r"is a shard's folder of the checkpoint .*ckpt, not a data dir"),
    ]:
        with pytest.raises(StorageError, match=said):
            Shard(ServerConfig(data_dir=str(data_dir)))
    assert files_of(checkpoint) == before and not (checkpoint / "shard-0" / "here").exists()


def test_export_writes_embeddings_at_one_cut_and_a_delta_since_a_step(tmp_path):
    original, addresses = start_servers(tmp_path / "original", 2)
    try:
        with Client(addresses) as client:
            for t in (BUSY, DENSE):
                client.create_table(t)
            old, new = IDS[:300], IDS[300:350]
            client.push("busy", old, np.ones((300, 2), np.float32))
            client.push("dense.w", np.arange(4, dtype=np.uint64), np.ones((4, 16), np.float32))
            step = client.advance_clock(5)
            client.push("busy", np.concatenate([old[:10], new]), np.ones((60, 2), np.float32))
            want = client.pull("busy", IDS[:350])
            base = [sys.executable, "-m", "worker", "export", "--servers", ",".join(addresses)]
            full = subprocess.run([*base, str(tmp_path / "full")], capture_output=True, text=True, timeout=120)
            delta = subprocess.run([*base, str(tmp_path / "delta"), "--since", str(step)], capture_output=True,
                                   text=True, timeout=120)  # fmt: skip
            assert full.returncode == 0 and delta.returncode == 0, full.stderr + delta.stderr
            assert "busy 350 x 2" in full.stdout and "dense.w 4 x 16" in full.stdout
    finally:
        stop(original)
    ids, rows = exported(tmp_path / "full", "busy")
    assert sorted(ids.tolist()) == sorted(IDS[:350].tolist()) and rows.shape == (350, 2)
    order = np.argsort(IDS[:350])
    np.testing.assert_array_equal(rows, want[order])  # the values the servers held: exact
    delta_ids = exported(tmp_path / "delta", "busy")[0]
    assert sorted(delta_ids.tolist()) == sorted(np.concatenate([IDS[:10], IDS[300:350]]).tolist())
    assert len(exported(tmp_path / "delta", "dense.w")[0]) == 0  # not pushed since
    assert not os.path.exists(tmp_path / "full" / "checkpoint")


def test_an_export_over_an_earlier_one_that_fails_leaves_the_earlier_one_as_it_was(tmp_path, monkeypatch):
    """ps-worker export --overwrite --keep-checkpoint whose save fails (another checkpoint holds a shard) keeps the
    earlier export and its checkpoint; ps-server export failing mid-way (a write error) changes no earlier file;
    an --out inside the checkpoint is refused."""
    import json

    from ps.checkpoint import read_manifest
    from ps.engine import export as engine_export
    from tests.test_worker_outputs import tree
    from worker import export as worker_export
    from worker.__main__ import main

    original, addresses = start_servers(tmp_path / "original", 2)
    out = tmp_path / "serving"
    try:
        with Client(addresses) as client:
            client.create_table(BUSY)
            client.push("busy", IDS[:100], np.ones((100, 2), np.float32))
        base = ["export", "--servers", ",".join(addresses), str(out), "--keep-checkpoint"]
        assert main(base) == 0
        earlier = tree(out)
        _, token = original[1].shard.hold(60)  # another checkpoint's: the next save fails
        try:
            assert main([*base, "--overwrite"]) != 0
        finally:
            original[1].shard.release(token)
        # ps-server export fails after the save made a new OUT
        monkeypatch.setattr(worker_export, "_run_server_export", lambda command, claim: 2)
        assert main(["export", "--servers", ",".join(addresses), str(tmp_path / "new-out")]) == 2
        monkeypatch.undo()
        assert not (tmp_path / "new-out").exists()  # the save's folder and the OUT it made, removed
    finally:
        stop(original)
    summary = json.loads((out / "export.json").read_text())
    kept = out / summary["dir"] / "checkpoint"
    assert tree(out) == earlier and sorted(os.listdir(out)) == sorted([summary["dir"], "export.json"])
    assert summary["checkpoint"] == str(kept)
    read_manifest(str(kept))  # still whole
    headers = []
    write_header = np.lib.format.write_array_header_1_0

    def failing_header(f, header):  # the second file cannot be written
        headers.append(1)
        if len(headers) == 2:
            raise OSError(28, "No space left on device")
        write_header(f, header)

    monkeypatch.setattr(np.lib.format, "write_array_header_1_0", failing_header)
    with pytest.raises(OSError, match=r"busy.rows.npy failed .*; nothing of an earlier export there was changed"):
        engine_export.export(str(kept), str(out), move_checkpoint=True)  # moved after the files: never moved here
    assert tree(out) == earlier
    monkeypatch.undo()

    def no_room(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(
        engine_export.leftovers, "open_temporary", no_room
    )  # export.json.tmp, once the checkpoint moved
    with pytest.raises(OSError, match="No space left"):
        engine_export.export(str(kept), str(out), move_checkpoint=True)
    assert tree(out) == earlier  # the checkpoint moved back, the new folder removed
    with pytest.raises(ValueError, match="lies inside the checkpoint"):
        engine_export.export(str(kept), str(kept / "shard-0"))


def test_a_manifest_edited_or_out_of_joint_is_refused_before_anything_is_copied(tmp_path):
    """A checkpoint of 2 shards: its manifest with an entry removed, an entry repeated, a table's dim changed, or
    its clock removed is refused, by its checksum (sha256) and, with the checksum made again, for what does not
    hang together; a manifest without a checksum, a shard whose files it does not list, and a file added to a
    shard's dir (a stray write-ahead log would replay into the rows) are refused too; the data dir is left
    untouched."""
    import json

    from ps.checkpoint import manifest_digest

    original, addresses = start_servers(tmp_path / "original", 2)
    try:
        with Client(addresses) as client:
            client.create_table(BUSY)
            client.push("busy", IDS[:100], np.ones((100, 2), np.float32))
            from worker.checkpoint import save

            saved = save(client, str(tmp_path / "ckpt"))
    finally:
        stop(original)
    path = tmp_path / "ckpt" / "manifest.json"
    good = json.loads(path.read_text())
    assert good["sha256"] == saved["sha256"] == manifest_digest(good)
    edits = {
        "an entry removed": (lambda m: m["shards"].pop(1), "lists shards \\[0\\] for num_shards 2"),
        "an entry repeated": (lambda m: m["shards"].append(m["shards"][0]), "lists shards \\[0, 0, 1\\]"),
        "a dim changed": (
            lambda m: m["tables"][0].update(dim=17),
            r"is damaged: shard-0: table 'busy' holds \d+ stored rows of neither a trained row's "
            r"size by the config read with \(its manifest's: 92 bytes\) nor a pending id's \(24\).* The restore stopped "
            "and deleted what it had copied",
        ),
        "the clock removed": (lambda m: m.pop("clock"), "has clock None, expected an integer"),
        "a shard_id removed": (lambda m: m["shards"][1].pop("shard_id"), "has a shard entry 1 it cannot read"),
        "a shard_id made true": (
            lambda m: m["shards"][1].update(shard_id=True, dir="shard-True"),
            "has a shard entry 1 it cannot read",
        ),  # fmt: skip
    }
    for i, (what, (edit, unchecked)) in enumerate(edits.items()):
        for checked in (True, False):
            m = json.loads(json.dumps(good))
            edit(m)
            if not checked:
                m["sha256"] = manifest_digest(m)
            path.write_text(json.dumps(m))
            data_dir = tmp_path / f"r{i}{checked}"
            expected = "does not match its checksum" if checked else unchecked
            with pytest.raises(StorageError, match=expected):
                Server(ServerConfig(data_dir=str(data_dir), restore_dir=str(tmp_path / "ckpt")))
            if what == "a dim changed" and not checked:  # found as the rows are read: what was copied is deleted
                from ps.engine.shard import Shard

                shard = Shard(ServerConfig(data_dir=str(data_dir)))  # no mark of an unfinished restore refuses it
                try:
                    assert shard.tables == {}
                finally:
                    shard.close()
                from ps.engine.export import export  # which reads every row, and names those of no size it makes

                with pytest.raises(StorageError, match=r"shard-0: table 'busy' holds \d+ stored rows of neither a "
                                   r"trained row's size by the config read with \(its manifest's: 92 bytes\)"):  # fmt: skip
                    export(str(tmp_path / "ckpt"), str(tmp_path / "dim-export"))
            else:
                assert not data_dir.exists(), what
    unsigned = {k: v for k, v in good.items() if k != "sha256"}
    no_files = json.loads(json.dumps(good))
    no_files["shards"][0]["files"] = {}
    no_files["sha256"] = manifest_digest(no_files)
    for m, expected in ((unsigned, "has no checksum of itself"), (no_files, "lists no file of shard-0")):
        path.write_text(json.dumps(m))
        with pytest.raises(StorageError, match=expected):
            Server(ServerConfig(data_dir=str(tmp_path / "unsigned"), restore_dir=str(tmp_path / "ckpt")))
        assert not (tmp_path / "unsigned").exists()
    path.write_text(json.dumps(good))
    stray = tmp_path / "ckpt" / "shard-1" / "000099.log"
    stray.write_bytes(b"a write-ahead log of another db")
    added = r"shard-1 holds files its manifest does not list \(000099.log\): files were added after the save"
    with pytest.raises(StorageError, match=added):
        Server(ServerConfig(data_dir=str(tmp_path / "stray"), restore_dir=str(tmp_path / "ckpt")))
    from ps.engine.export import export

    with pytest.raises(StorageError, match=added):
        export(str(tmp_path / "ckpt"), str(tmp_path / "stray-export"))
    assert not (tmp_path / "stray").exists() and not (tmp_path / "stray-export").exists()
    stray.unlink()
    restored, _ = start_servers(tmp_path / "restored", 1, restore=str(tmp_path / "ckpt"))
    stop(restored)


def test_a_save_whose_dir_here_is_not_the_servers_writes_no_manifest(tmp_path, monkeypatch):
    """The servers save into DIR as they see it; a worker that sees another folder at that path (another machine's
    mount) must not write a manifest there that names parts it does not hold: an error, and no manifest."""
    import worker.checkpoint
    from worker.checkpoint import save

    root = tmp_path / "cluster"
    root.mkdir()
    servers, addresses = start_servers(root, 2)
    try:
        with Client(addresses) as client:
            client.create_table(BUSY)
            client.push("busy", np.arange(10, dtype=np.uint64), np.ones((10, 2), np.float32))
            target = str(tmp_path / "ckpt")

            class ThisMachinesPath:  # what worker.checkpoint sees of DIR: no shard-1 in it
                def __getattr__(self, name):
                    return getattr(os.path, name)

                def isdir(self, path):
                    return False if path.endswith("shard-1") else os.path.isdir(path)

            class ThisMachinesOs:
                path = ThisMachinesPath()

                def __getattr__(self, name):
                    return getattr(os, name)

            monkeypatch.setattr(worker.checkpoint, "os", ThisMachinesOs())
            with pytest.raises(ValueError, match=r"holds no shard-1: the servers' DIR is not this machine's"):
                save(client, target)
            monkeypatch.undo()
            assert not os.path.exists(os.path.join(target, "manifest.json"))
    finally:
        stop(servers)


def test_a_shard_restored_or_emptied_under_a_running_client_refuses_its_pushes(tmp_path):
    """A worker's client read each shard's state id in wait_ready; a shard that comes back restored from a
    checkpoint (or on a new data dir) has another, and refuses the pushes and pulls of the old state's client,
    applying and reading nothing, so a run does not train on over a model that lost the pushes made since the
    checkpoint. A plain restart keeps the id."""
    from ps.errors import ModelStateReplacedError
    from worker.checkpoint import save

    (servers, addresses), ids = start_servers(tmp_path / "original", 1), IDS[:100]
    port, checkpoint = servers[0].port, tmp_path / "ckpt"

    def on_port(data_dir, restore=None) -> Server:
        server = Server(ServerConfig(data_dir=str(data_dir), port=port, restore_dir=restore,
                                     checkpoint_root=str(tmp_path)))  # fmt: skip
        server.start()
        return server

    with Client(addresses, server_timeout_s=30) as client:
        client.wait_ready()
        client.create_table(BUSY)
        client.push("busy", ids, np.ones((100, 2), np.float32))
        save(client, str(checkpoint))
        client.push("busy", ids, np.ones((100, 2), np.float32))  # trained past the checkpoint
        stop(servers)
        servers = [on_port(tmp_path / "restored", restore=str(checkpoint))]
        with pytest.raises(ModelStateReplacedError, match=rf"restored from checkpoint {checkpoint}, so what the "
                                                          "client pushed before is not here; the push was not applied"):  # fmt: skip
            client.push("busy", ids, np.ones((100, 2), np.float32))
        with pytest.raises(ModelStateReplacedError, match=rf"restored from checkpoint {checkpoint}, so its rows are "
                                                          "not those of the model state the client read before"):  # fmt: skip
            client.pull("busy", ids)
    with Client(addresses, server_timeout_s=30) as fresh:
        fresh.wait_ready()
        np.testing.assert_array_equal(fresh.pull("busy", ids), -np.ones((100, 2), np.float32))  # the checkpoint's
        stop(servers)
        servers = [on_port(tmp_path / "restored")]  # a plain restart: the same state
        fresh.push("busy", ids, np.ones((100, 2), np.float32))
        np.testing.assert_array_equal(fresh.pull("busy", ids), -2 * np.ones((100, 2), np.float32))
        stop(servers)
        servers = [on_port(tmp_path / "empty")]  # its volume lost: a new, empty data dir
        try:
            with pytest.raises(ModelStateReplacedError, match="started on a new, empty data dir"):
                fresh.push("busy", ids, np.ones((100, 2), np.float32))
        finally:
            stop(servers)


def test_a_table_made_during_the_save_is_left_out_and_the_checkpoint_restores(tmp_path, monkeypatch):
    """A CreateTable is not held: a table made after shard 0 saved and before shard 1 did is in shard 1's part only.
    It is not part of the cut: the manifest leaves it out (its tables, and its shards' rows), and the checkpoint
    restores (a manifest listing it would be refused by every restore: shard 0's part holds no table number for it)."""
    from ps.engine import checkpointing
    from worker.checkpoint import save

    servers, addresses = start_servers(tmp_path / "original", 2)
    saved_0, real_save = threading.Event(), checkpointing.ShardCheckpoints.save

    def save_then_a_table_made(self, *args):  # shard 1 saves once shard 0 did and a worker made "late"
        if self.shard_id == 0:
            try:
                return real_save(self, *args)
            finally:
                saved_0.set()
        assert saved_0.wait(60)
        with Client(addresses) as other:
            other.create_table(TableConfig("late", 4, optimizer=OptimizerConfig("sgd", 1.0)))
        return real_save(self, *args)

    try:
        with Client(addresses) as client:
            client.create_table(BUSY)
            client.push("busy", IDS[:100], np.ones((100, 2), np.float32))
            monkeypatch.setattr(checkpointing.ShardCheckpoints, "save", save_then_a_table_made)
            manifest = save(client, str(tmp_path / "ckpt"))
            monkeypatch.undo()
            assert [t["name"] for t in manifest["tables"]] == ["busy"]
            assert [sorted(s["rows"]) for s in manifest["shards"]] == [["busy"], ["busy"]]  # "late" nowhere in it
            with open(tmp_path / "ckpt" / "manifest.json") as f:
                assert [sorted(s["rows"]) for s in json.load(f)["shards"]] == [["busy"], ["busy"]]
    finally:
        stop(servers)
    for n in (1, 3):
        restored, addresses = start_servers(tmp_path / f"restored-{n}", n, restore=str(tmp_path / "ckpt"))
        try:
            with Client(addresses) as client:
                np.testing.assert_array_equal(client.pull("busy", IDS[:100]), -np.ones((100, 2), np.float32))
        finally:
            stop(restored)


def test_pushes_held_s_ends_at_the_release_not_after_the_manifests_table_configs(tmp_path, monkeypatch):
    """pushes_held_s (printed by `ps-worker checkpoint save`) counts from the hold of shard 0 to the release of every
    shard; the manifest's table configs read after the release (a DescribeTable per table, 0.5 s each here) are no
    part of it."""
    from worker.checkpoint import save

    servers, addresses = start_servers(tmp_path / "original", 2)
    try:
        with Client(addresses) as client:
            client.create_table(BUSY)
            client.push("busy", IDS[:100], np.ones((100, 2), np.float32))
            checkpoint, describe, spans = client.checkpoint, client.describe_table, {}

            def timed_checkpoint(requests):
                phase = next(iter(requests.values())).phase
                spans.setdefault("first hold sent", time.monotonic())
                replies = checkpoint(requests)
                if phase == "release":
                    spans["released"] = time.monotonic()
                return replies

            def slow_describe(*args, **kwargs):
                time.sleep(0.5)
                return describe(*args, **kwargs)

            monkeypatch.setattr(client, "checkpoint", timed_checkpoint)
            monkeypatch.setattr(client, "describe_table", slow_describe)
            manifest = save(client, str(tmp_path / "ckpt"))
            assert manifest["pushes_held_s"] <= round(spans["released"] - spans["first hold sent"], 3) + 0.001, spans
    finally:
        stop(servers)


def test_pushes_held_s_counts_the_holds_wait_for_the_pushes_in_flight(tmp_path):
    """A hold refuses pushes from the moment it comes, while it waits for the pushes in flight: pushes_held_s
    counts that wait too (here up to 1 s of a push in flight on shard 0, during which another push is refused)."""
    from ps.errors import CheckpointInProgressError
    from worker.checkpoint import save

    servers, addresses = start_servers(tmp_path / "original", 2)
    shard = servers[0].shard
    try:
        with Client(addresses) as client:
            client.create_table(BUSY)
            ids = IDS[shard.slot_map.shard_of(IDS) == 0][:10]
            apply_push, in_flight, times = shard.apply_push, threading.Event(), {}

            def slow_apply_push(*args, **kwargs):  # the push in flight the hold waits for
                in_flight.set()
                time.sleep(1.0)
                times["push done"] = time.monotonic()
                return apply_push(*args, **kwargs)

            shard.apply_push = slow_apply_push
            pusher = threading.Thread(target=lambda: shard.push("busy", ids, np.ones((len(ids), 2), np.float32)))
            pusher.start()
            assert in_flight.wait(10)
            manifests: list[dict] = []
            saver = threading.Thread(target=lambda: manifests.append(save(client, str(tmp_path / "ckpt"))))
            saver.start()
            wait_until(lambda: shard.checkpoints.gate.held_until, 10, "shard 0's hold to come")
            refused_at = time.monotonic()
            with pytest.raises(CheckpointInProgressError):  # refused while the hold waits for the push in flight
                shard.push("busy", ids, np.ones((len(ids), 2), np.float32))
            join_thread(pusher, 10, "the push in flight")
            join_thread(saver, 30, "the save")
            refused_s = times["push done"] - refused_at  # pushes were refused at least this long
            assert refused_s > 0.5, times
            assert manifests and manifests[0]["pushes_held_s"] >= refused_s, (manifests, refused_s)
    finally:
        stop(servers)
