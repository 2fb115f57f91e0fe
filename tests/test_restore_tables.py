"""A restore copies every table its manifest lists, or refuses: a checkpoint whose RocksDB holds no table number for
a table of the manifest (a damaged checkpoint, or a manifest of another checkpoint) is a start-up error naming the
table, not a table restored empty."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from ps.checkpoint import FORMAT, write_manifest
from ps.config import InitializerConfig, OptimizerConfig, ServerConfig, TableConfig
from ps.engine.shard import Shard
from ps.errors import StorageError
from ps.sharding import NUM_SLOTS


def table(name: str) -> TableConfig:
    return TableConfig(name, 2, InitializerConfig("zeros"), OptimizerConfig("sgd", 1.0))


def checkpoint(shard: Shard, directory: str, tables: list[TableConfig]) -> None:
    """A checkpoint of one shard whose manifest lists `tables` (as `ps-worker checkpoint save` writes it)."""
    clock, token = shard.hold(60)
    try:
        info = shard.save_checkpoint(directory, token)
    finally:
        shard.release(token)
    manifest = {"format": FORMAT, "num_shards": 1, "num_slots": NUM_SLOTS, "clock": clock, "created": "now",
                "tables": [t.to_dict() for t in tables], "shards": [info]}  # fmt: skip
    write_manifest(directory, manifest)


def test_a_table_of_the_manifest_the_checkpoint_lacks_is_refused_by_name(tmp_path):
    ids = np.arange(1, 6, dtype=np.uint64)
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        shard.create_table(table("kept"))
        shard.push("kept", ids, np.ones((5, 2), np.float32))
        checkpoint(shard, str(tmp_path / "good"), [table("kept")])
        checkpoint(shard, str(tmp_path / "bad"), [table("kept"), table("lost")])  # "lost" is in no RocksDB
    finally:
        shard.close()
    restored = Shard(ServerConfig(data_dir=str(tmp_path / "a"), restore_dir=str(tmp_path / "good")))
    try:
        np.testing.assert_array_equal(restored.pull("kept", ids), -np.ones((5, 2), np.float32))
    finally:
        restored.close()
    with pytest.raises(StorageError, match=r"holds no table number for table\(s\) 'lost' of its manifest"):
        Shard(ServerConfig(data_dir=str(tmp_path / "b"), restore_dir=str(tmp_path / "bad")))


def test_a_restart_with_the_same_restore_still_given_starts_on_what_the_dir_holds(tmp_path, caplog):
    """PS_RESTORE kept in a container's environment: the restart neither copies the checkpoint again (rows
    trained since stay) nor refuses; another checkpoint is refused, saying how to start."""
    ids = np.arange(1, 6, dtype=np.uint64)
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        shard.create_table(table("kept"))
        shard.push("kept", ids, np.ones((5, 2), np.float32))
        checkpoint(shard, str(tmp_path / "one"), [table("kept")])
        shard.push("kept", ids, np.ones((5, 2), np.float32))
        checkpoint(shard, str(tmp_path / "two"), [table("kept")])
    finally:
        shard.close()
    restored = Shard(ServerConfig(data_dir=str(tmp_path / "a"), restore_dir=str(tmp_path / "one")))
    assert restored.describe_start().startswith(f"restored from {tmp_path / 'one'}, tables kept 5 rows")
    restored.push("kept", ids, np.ones((5, 2), np.float32))  # trained after the restore
    restored.close()
    with caplog.at_level("INFO", "ps.engine.shard"):
        again = Shard(ServerConfig(data_dir=str(tmp_path / "a"), restore_dir=str(tmp_path / "one")))
    try:
        np.testing.assert_array_equal(again.pull("kept", ids), -2 * np.ones((5, 2), np.float32))
        assert again.describe_start().startswith("existing, tables kept 5 rows")
        assert "was restored from" in caplog.text and "starting on what it holds" in caplog.text
    finally:
        again.close()
    with pytest.raises(StorageError, match=r"has tables already \(and was not restored from that checkpoint\): leave "
                                           r"--restore \(PS_RESTORE\) out"):  # fmt: skip
        Shard(ServerConfig(data_dir=str(tmp_path / "a"), restore_dir=str(tmp_path / "two")))
    shutil.rmtree(tmp_path / "one")  # pruned since: its path still names the restore
    Shard(ServerConfig(data_dir=str(tmp_path / "a"), restore_dir=str(tmp_path / "one"))).close()


def test_export_holds_about_two_copies_of_what_it_writes_not_the_whole_rows(tmp_path):
    """ps-server export reads a table's rows (embedding, optimizer state, statistics: 28 floats for adam at dim 8)
    and writes the embeddings sorted by id. It held views of the whole rows and every sorted copy at once: 4.1x
    the bytes it wrote here (1.8 GB for a 12M-row table of 536 MB); now a copy of the embeddings per chunk read,
    and each sorted array written before the next is made."""
    import tracemalloc

    from ps.engine.restore import export

    n, spec = 1_000_000, TableConfig("emb", 8, optimizer=OptimizerConfig("adam", 0.01))
    ids = np.random.default_rng(0).permutation(np.arange(1, n + 1, dtype=np.uint64) * np.uint64(7919))
    grads = np.random.default_rng(1).standard_normal((n, 8)).astype(np.float32)
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        shard.create_table(spec)
        shard.push("emb", ids, grads)
        want = shard.pull("emb", np.sort(ids))
        checkpoint(shard, str(tmp_path / "ckpt"), [spec])
    finally:
        shard.close()
    tracemalloc.start()
    try:
        export(str(tmp_path / "ckpt"), str(tmp_path / "out"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    written = n * (8 + 8 * 4)  # ids and embeddings
    assert peak < 2.5 * written, f"{peak / written:.2f}x"
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "emb.ids.npy"), np.sort(ids))
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "emb.rows.npy"), want)


@pytest.mark.parametrize("no_progress", [False, True])
def test_ps_server_export_shows_rows_read_per_table_of_the_manifests_count(no_progress, tmp_path, capsys, monkeypatch):
    """A plain progress line (stderr no terminal) per table, rows read of the manifest's count; none with
    --no-progress; the files written are the same either way."""
    from ps.__main__ import main
    from ps.engine.restore import ExportProgress

    monkeypatch.setattr(ExportProgress, "PLAIN_EVERY_S", 0.0)
    specs = [TableConfig("a", 2), TableConfig("b", 3)]
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        for spec, n in zip(specs, (700, 40), strict=True):
            shard.create_table(spec)
            shard.push(spec.name, np.arange(1, n + 1, dtype=np.uint64), np.ones((n, spec.dim), np.float32))
        checkpoint(shard, str(tmp_path / "ckpt"), specs)
    finally:
        shard.close()
    flag = ["--no-progress"] if no_progress else []
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"), *flag]) == 0
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.startswith("export: ")]
    if no_progress:
        assert lines == [], err
    else:
        assert "export: table a: 700 of 700 rows read (100%), " in err and lines[-1].startswith(
            "export: table b: 40 of 40 rows read (100%), "
        ), err
    assert "exported the model" in out
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "a.ids.npy"), np.arange(1, 701, dtype=np.uint64))
