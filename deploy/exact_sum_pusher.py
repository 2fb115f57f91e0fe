"""An exact-sum pusher (ps-lite's check, as tests/integration/test_kill_restart.py runs it): pushes known gradients
to a running cluster while it is being disturbed, then checks the servers hold exactly the sum of the pushes
they acknowledged: none lost, none applied twice. deploy/smoke.sh runs it in the image, beside the workers.

    python3 exact_sum_pusher.py SERVERS TABLE STOP_FILE [PAUSE_S]
      SERVERS    comma-separated host:port list, in shard order
      TABLE      a table name not yet on the servers: created here (dim 4, zeros, SGD with learning rate 1)
      STOP_FILE  pushing stops once this file exists (or after 600 s)
      PAUSE_S    seconds between pushes (default 0.02)
    environment: PS_TLS_CA (the servers' CA), PS_AUTH_TOKEN_FILE (the token), as the workers take them

Push k (k = 1, 2, ...) sends gradient [1, 2, 3, 4] to each of SHARED (ids on every shard, each twice in the
batch with half of it: the client sums duplicates) and [1, 1, 1, 1] to each of own(k), ids no other push has.
The client sends a push again while its shard is down or restarting, and the shard applies each push once
(worker/retry.py, worker/request_numbers.py), so after n acknowledged pushes every SHARED row is -n * [1, 2, 3, 4]
and every own(k) row is -1 for k <= n and 0 (never pushed) for k = n + 1: a lost push k shows as an own(k) row
of 0, one applied twice as -2. Every value is an integer well inside float32's exact range.

Output, one line each: "pusher: table TABLE created", "pusher: N pushes acknowledged" every 50, then
"pusher: exact sum OK: N pushes acknowledged, M rows checked" (exit 0) or "pusher: exact sum WRONG: ..." (exit 1).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.secretfiles import optional_token, refuse_empty
from worker.client import Client

DIM = 4
SHARED = np.arange(1, 3001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # spread over every shard
MAX_SECONDS = 600.0


def own(k: int) -> np.ndarray:
    """The 10 ids only push k touches."""
    return np.arange(10, dtype=np.uint64) + np.uint64(10**12 + 10 * k)


def push(client: Client, table: str, k: int) -> None:
    ids = np.concatenate([SHARED, SHARED, own(k)])
    half = np.arange(1, DIM + 1, dtype=np.float32) / 2
    grads = np.concatenate([np.tile(half, (2 * len(SHARED), 1)), np.ones((10, DIM), np.float32)])
    client.push(table, ids, grads)


def check(client: Client, table: str, acknowledged: int) -> list[str]:
    """What differs from the exact sum of `acknowledged` pushes (empty: nothing)."""
    wrong = []
    expected = -acknowledged * np.arange(1, DIM + 1, dtype=np.float32)
    shared = client.pull(table, SHARED)
    if not (shared == expected).all():
        bad = np.flatnonzero((shared != expected).any(axis=1))
        wrong.append(f"{len(bad)} shared rows differ, e.g. {shared[bad[0]].tolist()} for {expected.tolist()}")
    pushes = np.arange(1, acknowledged + 2)
    rows = client.pull(table, np.concatenate([own(k) for k in pushes])).reshape(len(pushes), 10, DIM)
    want = np.where(pushes <= acknowledged, -1.0, 0.0)[:, None, None]
    for k in pushes[(rows != want).any(axis=(1, 2))]:
        wrong.append(f"the rows of push {k} are {rows[k - 1, 0].tolist()}, expected all {want[k - 1, 0, 0]}")
    return wrong


def main(argv: list[str]) -> int:
    servers, table, stop_file = argv[0].split(","), argv[1], argv[2]
    pause_s = float(argv[3]) if len(argv) > 3 else 0.02
    token_file, tls_ca = os.environ.get("PS_AUTH_TOKEN_FILE"), os.environ.get("PS_TLS_CA")
    refuse_empty(("PS_TLS_CA", tls_ca))
    token = optional_token("PS_AUTH_TOKEN_FILE", token_file)
    with Client(servers, timeout_s=10, server_timeout_s=180, tls_ca=tls_ca, auth_token=token) as c:
        c.wait_ready(timeout_s=120)
        c.create_table(TableConfig(table, DIM, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0)))
        print(f"pusher: table {table} created", flush=True)
        acknowledged = 0
        deadline = time.monotonic() + MAX_SECONDS
        while not os.path.exists(stop_file) and time.monotonic() < deadline:
            push(c, table, acknowledged + 1)
            acknowledged += 1
            if acknowledged % 50 == 0:
                print(f"pusher: {acknowledged} pushes acknowledged", flush=True)
            time.sleep(pause_s)
        wrong = check(c, table, acknowledged)
    if wrong:
        print(f"pusher: exact sum WRONG after {acknowledged} acknowledged pushes: " + "; ".join(wrong[:5]), flush=True)
        return 1
    rows = len(SHARED) + 10 * (acknowledged + 1)
    print(f"pusher: exact sum OK: {acknowledged} pushes acknowledged, {rows} rows checked", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
