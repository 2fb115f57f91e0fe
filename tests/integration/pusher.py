"""A worker process for the ps-lite style test: pushes known integer gradients, then exits.

usage: python -m tests.integration.pusher SERVERS WORKER ROUNDS [PAUSE_S]
Worker w in round r pushes grad (w + 1) * (r + 1) * [1, 2, ..., dim] to every shared id (twice in the
same batch, so the client must sum duplicates) and 1 to each of its own ids.
"""

import sys
import time

import numpy as np

from worker.client import Client

SHARED = np.arange(0, 5000, 7, dtype=np.uint64) * np.uint64(0x9E3779B9)  # ids spread over both shards
DIM = 4


def own_ids(worker: int) -> np.ndarray:
    return np.arange(100, dtype=np.uint64) + np.uint64(10**12 * (worker + 1))


def push_rounds(client: Client, worker: int, rounds: int, pause_s: float = 0.0) -> None:
    base = np.arange(1, DIM + 1, dtype=np.float32)
    for r in range(rounds):
        g = (worker + 1) * (r + 1) * base
        ids = np.concatenate([SHARED, SHARED, own_ids(worker)])
        grads = np.concatenate([np.tile(g / 2, (2 * len(SHARED), 1)), np.ones((100, DIM), dtype=np.float32)])
        client.push("sum", ids, grads)
        time.sleep(pause_s)


def expected_shared(workers: int, rounds: int) -> np.ndarray:
    """SGD lr=1 from zeros: minus the sum of every push."""
    total = sum((w + 1) * (r + 1) for w in range(workers) for r in range(rounds))
    return -total * np.arange(1, DIM + 1, dtype=np.float32)


if __name__ == "__main__":
    servers, worker, rounds = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
    pause = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    with Client(servers, timeout_s=30, server_timeout_s=120) as c:
        c.wait_ready()
        push_rounds(c, worker, rounds, pause)
