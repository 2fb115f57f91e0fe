"""--local-shards (worker.cluster.LocalCluster, through worker.job.job_client): a local shard that dies is never
restarted, so a call to it fails at once, naming it and how it ended, instead of waiting --server-timeout; its log
stays, its rows do not."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time

import pytest

from ps.errors import ServerUnavailableError
from tests.waiting import wait_until
from worker import job
from worker.cluster import LocalCluster
from worker.train import train
from worker.train_config import TrainConfig


class RecordedCluster(LocalCluster):
    made: list[LocalCluster] = []

    def __enter__(self) -> LocalCluster:
        RecordedCluster.made.append(self)
        return super().__enter__()


def test_a_training_run_whose_local_shard_dies_fails_at_once_saying_so(monkeypatch):
    monkeypatch.setattr(job, "LocalCluster", RecordedCluster)
    monkeypatch.setattr(RecordedCluster, "made", [])
    cfg = TrainConfig(local_shards=2, server_timeout_s=300.0, synthetic_rows=5_000_000, progress=False)
    killed: list[int] = []

    def kill_shard_1() -> None:
        wait_until(lambda: RecordedCluster.made and len(RecordedCluster.made[0].addresses) == 2, 60, "the shards")
        time.sleep(3.0)  # training under way
        killed.append(RecordedCluster.made[0].procs[1].pid)
        os.kill(killed[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_shard_1, daemon=True)
    killer.start()
    started = time.monotonic()
    try:
        with pytest.raises(ServerUnavailableError) as info:
            train(cfg)
        killer.join(10)
        assert time.monotonic() - started < 120  # not the 300 s of --server-timeout
        said, root = str(info.value), RecordedCluster.made[0].root
        assert f"local shard 1 (pid {killed[0]}) was killed by SIGKILL, and a local shard is not restarted" in said, (
            said
        )
        log = os.path.join(root, "shard-1.log")
        assert f"(its log: {log})" in said and os.path.exists(log)  # kept; the rows deleted
        assert not os.path.exists(os.path.join(root, "shard-0")) and not os.path.exists(os.path.join(root, "shard-1"))
        with open(os.path.join(root, "KEPT")) as f:
            assert f.read().startswith(f"local shard 1 (pid {killed[0]}) was killed by SIGKILL")
    finally:
        for cluster in RecordedCluster.made:  # the kept dir, which no later run removes
            shutil.rmtree(cluster.root, ignore_errors=True)
