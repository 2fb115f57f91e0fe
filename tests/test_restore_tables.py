"""A restore copies every table its manifest lists, or refuses: a checkpoint whose RocksDB holds no table number for
a table of the manifest (a damaged checkpoint, or a manifest of another checkpoint) is a start-up error naming the
table, not a table restored empty."""

from __future__ import annotations

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
