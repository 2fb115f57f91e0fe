"""kill -9 a server during a stream of pushes, restart it on the same data dir: every acknowledged push is
in the rows (and the one in flight, if any, is applied once or not at all)."""

import threading
import time
from collections.abc import Callable

import numpy as np

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.errors import PsError
from tests.waiting import join_thread, wait_until
from worker.client import Client
from worker.cluster import LocalCluster

COMMON = np.arange(2000, dtype=np.uint64)  # in every push
DIM = 4


def own(k: int) -> np.ndarray:
    return np.arange(100, dtype=np.uint64) + np.uint64(10_000 + 100 * k)  # only in push k


def kill_after(cluster: LocalCluster, acknowledged: Callable[[], int], n: int, killed: threading.Event) -> None:
    """SIGKILLs shard 0 once acknowledged() reaches n (run on a thread, while pushes go on)."""
    wait_until(lambda: acknowledged() >= n, 120, f"{n} acknowledged pushes")
    cluster.kill(0)
    killed.set()


def test_every_acknowledged_push_survives_kill_9(tmp_path):
    # a tiny RAM tier (evictions write dirty rows back all the time) and a busy flusher (journal trims)
    cluster = LocalCluster(1, root=str(tmp_path), extra_args=["--cache-bytes", "64K", "--flush-interval-s", "0.05"])
    addresses = cluster.start()
    acked = 0
    try:
        # 120 s a call: a cold numba cache compiles the push kernels in the first push (30 s under load)
        with Client(addresses, timeout_s=120, server_timeout_s=0) as client:
            client.wait_ready()
            client.create_table(TableConfig("c", DIM, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0)))
            # kill -9 from another thread once 30 pushes are acknowledged, while the next ones are in flight
            killed = threading.Event()
            killer = threading.Thread(target=kill_after, args=(cluster, lambda: acked, 30, killed))
            killer.start()
            deadline = time.monotonic() + 120  # a cold numba cache compiles the push kernels on the first push
            try:
                while time.monotonic() < deadline:
                    ids = np.concatenate([COMMON, own(acked)])
                    client.push("c", ids, np.ones((len(ids), DIM), dtype=np.float32))
                    acked += 1
            except PsError:
                pass  # the server died under the push in flight
            join_thread(killer, 60, "the thread that kills the server")
        assert killed.is_set() and acked >= 30, (
            f"the pushes ended after {acked} acknowledged, killed: {killed.is_set()}"
        )
        print(f"{acked} pushes acknowledged before kill -9")
        cluster.stop()
        addresses = cluster.start()
        with Client(addresses) as client:
            client.wait_ready()
            common = client.pull("c", COMMON)
            applied = -common[0, 0]
            assert applied in (acked, acked + 1)  # the push in flight may have made it to the journal
            np.testing.assert_array_equal(common, np.full_like(common, -applied))
            for k in range(int(applied)):
                np.testing.assert_array_equal(client.pull("c", own(k)), np.full((100, DIM), -1.0))
            assert (client.pull("c", own(int(applied))) == 0).all()
            assert client.describe_table("c")[0].num_rows == len(COMMON) + 100 * applied
    finally:
        cluster.stop()
