"""Two checkpoints behind a symbolic link that a save moves (`latest`, as `ln -sfn` keeps one to the newest save),
for the tests of what restore, export and `ps-server verify` read through such a link."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ps.checkpoint import FORMAT, write_manifest
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.server_config import ServerConfig
from ps.sharding import NUM_SLOTS, SlotMap


def two_saves_behind_a_link(tmp_path: Path) -> tuple[str, np.ndarray]:
    """(tmp_path/latest, ids): two checkpoints of 2 shards, tmp_path/one (tables a and b: every id's row -1) and
    tmp_path/two (-2, pushed once more), and a link `latest` to one, as a job that saves every hour keeps one to
    its newest save (`ln -sfn`)."""
    ids = np.arange(1, 201, dtype=np.uint64)
    owner = SlotMap.contiguous(2).shard_of(ids)
    specs = [TableConfig(name, 2, InitializerConfig("zeros"), OptimizerConfig("sgd", 1.0)) for name in "ab"]
    shards = [Shard(ServerConfig(data_dir=str(tmp_path / f"source-{i}"), shard_id=i, num_shards=2)) for i in range(2)]
    try:
        for name in ("one", "two"):
            infos, clocks = [], []
            for i, shard in enumerate(shards):
                for spec in specs:
                    shard.create_table(spec)
                    shard.push(spec.name, ids[owner == i], np.ones((int(np.sum(owner == i)), 2), np.float32))
                clock, token = shard.hold(60)
                try:
                    infos.append(shard.save_checkpoint(str(tmp_path / name), token))
                finally:
                    shard.release(token)
                clocks.append(clock)
            write_manifest(str(tmp_path / name), {"format": FORMAT, "num_shards": 2, "num_slots": NUM_SLOTS,
                                                  "clock": max(clocks), "created": "now",
                                                  "tables": [t.to_dict() for t in specs], "shards": infos})  # fmt: skip
    finally:
        for shard in shards:
            shard.close()
    os.symlink("one", tmp_path / "latest")
    return str(tmp_path / "latest"), ids


def move_link(link: str, target: str) -> None:
    """Points link at target in one rename, as `ln -sfn target link` does."""
    os.symlink(target, link + ".new")
    os.replace(link + ".new", link)
