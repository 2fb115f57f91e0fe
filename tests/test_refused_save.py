"""A Checkpoint save refused for its directory (one that exists already, or one that cannot be created) changes
nothing: the shard checks the directory before it flushes, so its dirty rows stay dirty (found by
tests/test_fuzz.py), and the parents it created for it are removed again. Black box: through gRPC, the dirty rows as Stats reports them; the background flusher is off."""

from __future__ import annotations

import dataclasses

import grpc
import numpy as np
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps.errors import NoCheckpointRootError, ServerUnavailableError
from ps.server import Server
from ps.server_config import ServerConfig

TIMEOUT_S = 30


def test_a_save_refused_for_its_directory_flushes_nothing(tmp_path):
    root = tmp_path / "root"
    (root / "taken" / "shard-0").mkdir(parents=True)  # a checkpoint of this shard is there already
    (root / "linked").mkdir()
    (root / "linked" / "shard-0").symlink_to(root / "nowhere")  # a dangling link: RocksDB could not write there
    (root / "file").write_bytes(b"a file, not a directory")
    fields = (
        {"checkpoint_root": str(root)}
        if "checkpoint_root" in {f.name for f in dataclasses.fields(ServerConfig)}
        else {}
    )
    server = Server(ServerConfig(data_dir=str(tmp_path / "d"), port=0, flush_interval_s=3600.0, **fields))
    port = server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    try:
        stub.CreateTable(ps_pb2.CreateTableRequest(spec=ps_pb2.TableSpec(name="t", dim=2)), timeout=TIMEOUT_S)
        ids = np.arange(1, 9, dtype="<u8")
        grads = np.ones((8, 2), dtype="<f4")
        stub.Push(ps_pb2.PushRequest(table="t", ids=ids.tobytes(), grads=grads.tobytes(), dim=2), timeout=TIMEOUT_S)
        dirty = lambda: stub.Stats(ps_pb2.StatsRequest(), timeout=TIMEOUT_S).tables[0].dirty_rows
        assert dirty() == 8
        token = stub.Checkpoint(ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=60), timeout=TIMEOUT_S).token
        for target, code in ((root / "taken", grpc.StatusCode.INVALID_ARGUMENT),
                             (root / "linked", grpc.StatusCode.INVALID_ARGUMENT),
                             (root / "file" / "sub", grpc.StatusCode.FAILED_PRECONDITION),
                             (root / "new" / "deeper" / ("x" * 300), grpc.StatusCode.INVALID_ARGUMENT)):  # fmt: skip
            with pytest.raises(grpc.RpcError) as e:
                stub.Checkpoint(ps_pb2.CheckpointRequest(phase="save", dir=str(target), token=token), timeout=TIMEOUT_S)
            assert e.value.code() == code, (target, e.value.code(), e.value.details())
            if target.name in ("taken", "linked"):
                assert e.value.details() == f"checkpoint dir {target / 'shard-0'} exists already; give a new directory"
            assert dirty() == 8, f"the save to {target} was refused ({e.value.details()}), yet it flushed the rows"
            assert sorted(p.name for p in root.iterdir()) == ["file", "linked", "taken"], "a refused save left dirs"
        stub.Checkpoint(ps_pb2.CheckpointRequest(phase="save", dir=str(root / "new"), token=token), timeout=TIMEOUT_S)
        assert dirty() == 0  # a save that is taken flushes
        stub.Checkpoint(ps_pb2.CheckpointRequest(phase="release", token=token), timeout=TIMEOUT_S)
    finally:
        channel.close()
        server.stop(grace_s=1)


def test_a_save_that_fails_on_one_shard_names_the_parts_the_others_left(tmp_path):
    """Shard 0 saves its part, shard 1 refuses (it takes no checkpoints): the error says which shard-<i> folders
    are in DIR, without a manifest, and that DIR takes no save until they are gone."""
    from ps.config import TableConfig
    from ps.errors import PsError
    from worker.checkpoint import save
    from worker.client import Client

    root = tmp_path / "root"
    servers = [
        Server(ServerConfig(data_dir=str(tmp_path / f"d{i}"), port=0, shard_id=i, num_shards=2,
                            checkpoint_root=str(root) if i == 0 else None))
        for i in range(2)
    ]  # fmt: skip
    try:
        addresses = [f"127.0.0.1:{s.start()}" for s in servers]
        with Client(addresses) as client:
            client.create_table(TableConfig(name="t", dim=2))
            client.push("t", np.arange(100, dtype=np.uint64), np.ones((100, 2), np.float32))
            with pytest.raises(PsError) as refused:
                save(client, str(root / "c"))
        text = str(refused.value)
        assert "takes no checkpoints" in text, text
        assert text.startswith(f"the save into {root / 'c'} failed: ") and "with no manifest.json it is not a" in text
        assert f"{root / 'c'} holds shard-0, the part of each shard whose save finished; a shard whose" in text
        assert sorted(p.name for p in (root / "c").iterdir()) == ["shard-0"]
        assert refused.value.shard_outcomes == [ps_pb2.CheckpointResponse, NoCheckpointRootError]
    finally:
        for s in servers:
            s.stop()


@pytest.mark.parametrize(
    "outcomes, short",
    [
        ([NoCheckpointRootError, NoCheckpointRootError], True),  # every shard refused: none saved anywhere
        ([ps_pb2.CheckpointResponse, NoCheckpointRootError], False),  # shard 0 saved, into its machine's DIR
        ([NoCheckpointRootError, ServerUnavailableError], False),  # shard 1 did not answer: it may save
        (None, False),  # not known
    ],
)
def test_nothing_was_saved_is_said_only_where_every_shard_refused_for_no_checkpoint_root(tmp_path, outcomes, short):
    """A refusal for no --checkpoint-root, no shard part seen in DIR on this machine: "nothing was saved into DIR"
    only where every shard refused so; else a shard may have saved its part into DIR on another machine (the
    servers' DIR), and the error says what this machine sees."""
    from worker.checkpoint_left import note_parts_left

    directory = str(tmp_path / "c")  # this machine sees nothing there
    said = "shard 1 at 127.0.0.1:1: Checkpoint failed with FAILED_PRECONDITION: this server takes no checkpoints"
    error = NoCheckpointRootError(said)
    if outcomes is not None:
        error.shard_outcomes = outcomes
    note_parts_left(error, directory)
    if short:
        assert str(error) == f"nothing was saved into {directory}: {said}"
    else:
        assert str(error).startswith(f"the save into {directory} failed: {said}. This machine sees nothing at "), error
        assert "nothing was saved" not in str(error)


def test_a_failed_save_tells_a_finished_part_from_one_a_killed_shard_left_unfinished(tmp_path):
    """A shard killed mid-save leaves RocksDB's shard-<i>.tmp: the error names it apart, as unfinished, not among
    the parts whose save finished."""
    from ps.errors import PsError
    from worker.checkpoint_left import note_parts_left

    for name in ("shard-0", "shard-1.tmp", "shard-2", "shard-3.tmp"):
        (tmp_path / name).mkdir()
    error = PsError("shard 1 at 127.0.0.1:1: Checkpoint failed with UNAVAILABLE")
    note_parts_left(error, str(tmp_path))
    assert str(error) == (
        f"the save into {tmp_path} failed: shard 1 at 127.0.0.1:1: Checkpoint failed with UNAVAILABLE. {tmp_path} "
        "holds shard-0, shard-2, the part of each shard whose save finished; and shard-1.tmp, shard-3.tmp, the "
        "unfinished part of each shard whose save was cut off (its server died) or still runs; a shard whose save "
        "did not answer may still write its part there; with no manifest.json it is not a checkpoint: delete it "
        "once the shards are done, before saving into it again"
    )
    (tmp_path / "shard-0").rmdir()
    (tmp_path / "shard-2").rmdir()
    error = PsError("cut off")
    note_parts_left(error, str(tmp_path))
    assert f"{tmp_path} holds shard-1.tmp, shard-3.tmp, the unfinished part" in str(error)
    assert "whose save finished" not in str(error)


def test_a_save_refused_for_no_checkpoint_root_says_only_that_and_what_to_do(tmp_path):
    """The one shard refuses the save before making DIR (no --checkpoint-root): the error says nothing was saved and
    the server's words on what to do, with no advice on half-finished saves or shard-<i> folders to delete."""
    from ps.config import TableConfig
    from ps.errors import PsError
    from worker.checkpoint import save
    from worker.client import Client

    server = Server(ServerConfig(data_dir=str(tmp_path / "d0"), port=0))  # no --checkpoint-root: no checkpoints
    try:
        with Client([f"127.0.0.1:{server.start()}"]) as client:
            client.create_table(TableConfig(name="t", dim=2))
            with pytest.raises(PsError) as refused:
                save(client, str(tmp_path / "c"))
        text = str(refused.value)
        assert text.startswith(f"nothing was saved into {tmp_path / 'c'}: shard 0 at "), text
        assert text.endswith(
            "this server takes no checkpoints: start ps-server with --checkpoint-root DIR "
            "(PS_CHECKPOINT_ROOT) to let it write checkpoints inside DIR"
        ), text
        assert "shard-<i>" not in text and not (tmp_path / "c").exists()
    finally:
        server.stop()


@pytest.fixture
def two_shards_one_lacking_a_table(tmp_path):
    """(Client, root, stub of shard 1): two shards with --checkpoint-root root, table emb trained on both, table
    side (untrained) made on shard 1 alone (a CreateTable that reached one shard)."""
    from ps import codec
    from ps.config import TableConfig
    from worker.client import Client

    root = tmp_path / "root"
    servers = [Server(ServerConfig(data_dir=str(tmp_path / f"d{i}"), port=0, shard_id=i, num_shards=2,
                                   checkpoint_root=str(root))) for i in range(2)]  # fmt: skip
    addresses = [f"127.0.0.1:{s.start()}" for s in servers]
    channel = grpc.insecure_channel(addresses[1])
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    create_side = lambda: stub.CreateTable(
        ps_pb2.CreateTableRequest(spec=codec.table_config_to_proto(TableConfig(name="side", dim=8))), timeout=TIMEOUT_S
    )
    try:
        with Client(addresses) as client:
            client.create_table(TableConfig(name="emb", dim=2))
            client.push("emb", np.arange(100, dtype=np.uint64), np.ones((100, 2), np.float32))
            yield client, root, create_side
    finally:
        channel.close()
        for s in servers:
            s.stop()


def test_a_table_some_shards_lack_is_refused_before_any_hold(two_shards_one_lacking_a_table, monkeypatch):
    """An untrained table on shard 1 alone: the save is refused naming it and the shard that lacks it, before a
    shard is held (no debris in DIR); an export's save for the other tables alone is taken."""
    import worker.checkpoint
    from worker.checkpoint import save

    client, root, create_side = two_shards_one_lacking_a_table
    create_side()
    real_hold = worker.checkpoint._hold

    def no_hold(*args):
        raise AssertionError("a shard was held")

    monkeypatch.setattr(worker.checkpoint, "_hold", no_hold)
    with pytest.raises(ValueError, match=r"table side is on shard 1 only, not on shard 0: such a table holds no row "
                                         r"yet .*; nothing was saved$"):  # fmt: skip
        save(client, str(root / "c"))
    assert not (root / "c").exists()
    monkeypatch.setattr(worker.checkpoint, "_hold", real_hold)
    manifest = save(client, str(root / "c"), tables={"emb"})  # ps-worker export --tables emb
    assert [t["name"] for t in manifest["tables"]] == ["emb", "side"]


def test_a_table_made_and_trained_on_some_shards_during_the_save_names_the_parts_left(
    two_shards_one_lacking_a_table, monkeypatch
):
    """The table is made on shard 1 after the Stats that the save checks, so shard 1 alone saves it, and shard 1's
    part holds rows of it (pushed to shard 1's ids): no manifest is written, and the error says the shard-<i>
    folders in DIR are no checkpoint, to be deleted. (Such a table without rows is left out of the manifest:
    tests/integration/test_checkpoint.py.)"""
    from ps.sharding import SlotMap
    from worker.checkpoint import save
    from worker.client import Client

    client, root, create_side = two_shards_one_lacking_a_table
    stats = client.stats

    def stats_then_create() -> list:
        seen = stats()
        create_side()
        ids = np.arange(200, dtype=np.uint64)
        ids = ids[SlotMap.contiguous(2).shard_of(ids) == 1]
        with Client([client.servers[1]]) as shard_1_alone:  # shard 0 has no such table to describe
            shard_1_alone.push("side", ids, np.ones((len(ids), 8), np.float32))
        return seen

    monkeypatch.setattr(client, "stats", stats_then_create)
    with pytest.raises(ValueError) as failed:
        save(client, str(root / "c"))
    text = str(failed.value)
    assert text.startswith(f"the save into {root / 'c'} failed after every shard saved its part there: "), text
    assert "table(s) 'side' were saved by shards [1] with rows, and not by the others: made during the save" in text
    assert f"so the shard-<i> folders there are not a checkpoint: delete {root / 'c'}" in text
    assert sorted(p.name for p in (root / "c").iterdir()) == ["shard-0", "shard-1"]


def test_a_release_that_fails_after_the_save_names_the_parts_left(two_shards_one_lacking_a_table, monkeypatch):
    from ps.errors import PsError
    from worker.checkpoint import save

    client, root, _ = two_shards_one_lacking_a_table
    checkpoint = client.checkpoint

    def release_fails(requests: dict) -> list:
        replies = checkpoint(requests)
        if any(r.phase == "release" for r in requests.values()):
            raise PsError("the release did not answer")
        return replies

    monkeypatch.setattr(client, "checkpoint", release_fails)
    with pytest.raises(PsError, match=rf"^the save into {root / 'c'} failed after every shard saved its part there: "
                                      r"the release did not answer\. No manifest.json was written"):  # fmt: skip
        save(client, str(root / "c"))
    assert sorted(p.name for p in (root / "c").iterdir()) == ["shard-0", "shard-1"]


def test_a_server_list_missing_a_shard_is_refused_before_any_hold(two_shards_one_lacking_a_table):
    """A client of shard 0 alone (its list not checked by wait_ready) would save a checkpoint of 1 shard, which
    restores as a whole model without shard 1's rows: refused before any shard is held, nothing written."""
    from ps.errors import PsError
    from worker.checkpoint import save
    from worker.client import Client

    client, root, _ = two_shards_one_lacking_a_table
    missing = "the cluster has 2 shards, the list 1; shard 1 is missing"
    with Client(client.servers[:1]) as shard_0_alone, pytest.raises(PsError, match=missing):
        save(shard_0_alone, str(root / "half"))
    assert not (root / "half").exists()
    save(client, str(root / "whole"))  # no hold was left behind
