"""ps-lite's headline test: W worker processes push known gradients to S server processes with SGD lr=1;
every pulled row equals the exact sum. Then the servers restart on the same data dirs and nothing changed."""

import subprocess
import sys

import numpy as np

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from tests.integration.pusher import DIM, SHARED, expected_shared, own_ids
from worker.client import Client
from worker.cluster import LocalCluster

WORKERS, SHARDS, ROUNDS = 3, 2, 5


def test_workers_push_exact_sums_that_survive_a_restart(tmp_path):
    cluster = LocalCluster(SHARDS, root=str(tmp_path))
    addresses = cluster.start()
    try:
        with Client(addresses) as client:
            client.wait_ready()
            client.create_table(TableConfig("sum", DIM, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0)))
            procs = [
                subprocess.Popen(
                    [sys.executable, "-m", "tests.integration.pusher", ",".join(addresses), str(w), str(ROUNDS)]
                )
                for w in range(WORKERS)
            ]
            try:
                assert [p.wait(timeout=120) for p in procs] == [0] * WORKERS
            finally:  # a pusher still running after a failure would retry against the stopped shards for minutes
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            shared = client.pull("sum", SHARED)
            own = [client.pull("sum", own_ids(w)) for w in range(WORKERS)]
            np.testing.assert_array_equal(shared, np.tile(expected_shared(WORKERS, ROUNDS), (len(SHARED), 1)))
            for rows in own:
                np.testing.assert_array_equal(rows, np.full((100, DIM), -float(ROUNDS)))
            per_shard = [sum(t.num_rows for t in s.tables) for s in client.stats()]
            assert sum(per_shard) == len(SHARED) + WORKERS * 100 and min(per_shard) > 0
        assert cluster.stop() == [0] * SHARDS  # SIGTERM: clean exit

        addresses = cluster.start()  # same data dirs, new ports
        with Client(addresses) as client:
            client.wait_ready()
            np.testing.assert_array_equal(client.pull("sum", SHARED), shared)
            for w in range(WORKERS):
                np.testing.assert_array_equal(client.pull("sum", own_ids(w)), own[w])
    finally:
        cluster.stop()
