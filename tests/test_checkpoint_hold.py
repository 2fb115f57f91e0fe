"""The hold a checkpoint takes on a shard: pushes are refused while it lasts, a save needs the hold's token and a
hold that has not expired, only the holder releases it, and it cannot be held twice."""

from __future__ import annotations

import numpy as np
import pytest

from ps.config import InitializerConfig, OptimizerConfig, ServerConfig, TableConfig
from ps.engine.shard import Shard
from ps.errors import CheckpointInProgressError
from tests.waiting import wait_until


def pushed(shard: Shard, ids: np.ndarray) -> bool:
    """Pushes ones for ids; False if the shard refused it because a checkpoint holds it."""
    try:
        shard.push("t", ids, np.ones((len(ids), 2), np.float32))
    except CheckpointInProgressError:
        return False
    return True


def test_hold_save_release(tmp_path):
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))
    try:
        shard.create_table(TableConfig("t", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0)))
        ids = np.arange(3, dtype=np.uint64)
        _, token = shard.hold(60)
        with pytest.raises(CheckpointInProgressError, match="taking a checkpoint"):
            shard.push("t", ids, np.ones((3, 2), np.float32))
        with pytest.raises(CheckpointInProgressError, match="held by another checkpoint"):
            shard.hold(60)
        shard.release("not-the-token")  # a stale token releases nothing
        with pytest.raises(CheckpointInProgressError):
            shard.push("t", ids, np.ones((3, 2), np.float32))
        with pytest.raises(CheckpointInProgressError, match="hold expired or was released"):
            shard.save_checkpoint(str(tmp_path / "c1"), "not-the-token")
        assert shard.save_checkpoint(str(tmp_path / "c1"), token)["rows"] == {"t": 0}
        shard.release(token)
        shard.push("t", ids, np.ones((3, 2), np.float32))

        _, token = shard.hold(0.05)  # expires before the save: pushes go on, the save is refused
        wait_until(lambda: pushed(shard, ids), 10, "pushes taken again once the 0.05 s hold expired")
        np.testing.assert_array_equal(shard.pull("t", ids), np.full((3, 2), -2, np.float32))  # refused: no change
        with pytest.raises(CheckpointInProgressError, match="hold expired"):
            shard.save_checkpoint(str(tmp_path / "c2"), token)
        assert not (tmp_path / "c2").exists()
    finally:
        shard.close()


def test_a_restore_that_did_not_finish_is_refused_at_start(tmp_path):
    from ps.errors import StorageError
    from ps.storage.store import Store

    store = Store(str(tmp_path / "d"))
    store.check_identity(0, 1)
    store.set_restore_pending("/backups/ckpt")  # as a crash in the middle of restore_into leaves it
    store.close()
    for restore in (None, str(tmp_path / "ckpt")):
        with pytest.raises(StorageError, match="holds a restore from /backups/ckpt that did not finish"):
            Shard(ServerConfig(data_dir=str(tmp_path / "d"), restore_dir=restore))
