"""Hot pull and push throughput of one server process, next to a bare gRPC round trip of the same bytes.

    python benchmarks/pull_push.py [--ids 100000] [--dim 16] [--rows 2000000] [--reps 30]

A table of --rows rows (dim 16, Adagrad) is filled so every row is in the RAM tier; then each rep pulls (or
pushes) --ids distinct random ids in one request. Both clients do the same work: they send pre-serialized request
bytes and receive the reply's bytes without parsing them (a raw gRPC method), so the difference is the server's.
The reference is an echo server in its own process that receives and sends the same number of bytes with no
protobuf and no work; its requests are built once too. Server and echo calls alternate (pull, echo, pull, ...),
so a change in this shared machine's speed during the run hits both alike.
Targets: pull >= 50% and push >= 40% of the echo rates.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from common import (
    EchoServer,
    channel,
    create_table,
    emit,
    pull_request,
    push_request,
    rate,
    spread,
    stub,
    timed_alternately,
)  # fmt: skip

from protos import ps_pb2
from ps.accel.malloc import tune_malloc
from worker.cluster import LocalCluster


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ids", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    tune_malloc()
    rng = np.random.default_rng(0)
    n, dim = args.ids, args.dim
    batches = [rng.choice(args.rows, n, replace=False).astype(np.uint64) for _ in range(8)]
    grads = rng.standard_normal((n, dim)).astype(np.float32) * 0.01

    ids_bytes, rows_bytes = 8 * n, 4 * n * dim
    with LocalCluster(1, extra_args=["--cache-bytes", "4G"]) as cluster, EchoServer() as echo:
        s = stub(cluster.addresses[0])
        create_table(s, "hot", dim)
        for lo in range(0, args.rows, 500_000):  # admit every row to RAM
            s.Pull(pull_request("hot", np.arange(lo, min(lo + 500_000, args.rows), dtype=np.uint64)))
        ch = channel(cluster.addresses[0])
        raw_pull = ch.unary_unary("/sparseps.ParameterServer/Pull")  # bytes in, bytes out, like the echo
        raw_push = ch.unary_unary("/sparseps.ParameterServer/Push")
        pulls = [pull_request("hot", b).SerializeToString() for b in batches]
        pushes = [push_request("hot", b, grads).SerializeToString() for b in batches]
        reply = ps_pb2.PullResponse.FromString(raw_pull(pulls[0]))  # what the timed calls get is real rows
        assert len(reply.rows) == 4 * n * dim and reply.dim == dim
        echo_pull = echo.request(bytes(ids_bytes), rows_bytes)
        echo_push = echo.request(bytes(ids_bytes + rows_bytes), 8)
        i = iter(range(10**9))
        pull_s, echo_pull_s = timed_alternately(
            [lambda: raw_pull(pulls[next(i) % 8]), lambda: echo.round_trip(echo_pull)], args.reps
        )
        push_s, echo_push_s = timed_alternately(
            [lambda: raw_push(pushes[next(i) % 8]), lambda: echo.round_trip(echo_push)], args.reps
        )
        assert ps_pb2.PushResponse.FromString(raw_push(pushes[0])).num_applied == n

    r = {
        "ids_per_request": n,
        "dim": dim,
        "table_rows": args.rows,
        "pull_ids_per_s": rate(n, pull_s),
        "push_ids_per_s": rate(n, push_s),
        "echo_pull_ids_per_s": rate(n, echo_pull_s),
        "echo_push_ids_per_s": rate(n, echo_push_s),
    }
    r["pull_vs_echo"] = r["pull_ids_per_s"] / r["echo_pull_ids_per_s"]
    r["push_vs_echo"] = r["push_ids_per_s"] / r["echo_push_ids_per_s"]
    print(f"{n:,} ids x dim {dim}, table of {args.rows:,} hot rows, one server process")
    print(
        f"pull: {spread(n, pull_s)} ids/s   echo of the same bytes: {spread(n, echo_pull_s)}  -> {r['pull_vs_echo']:.0%}"
    )
    print(
        f"push: {spread(n, push_s)} ids/s   echo of the same bytes: {spread(n, echo_push_s)}  -> {r['push_vs_echo']:.0%}"
    )
    emit(r)


if __name__ == "__main__":
    sys.exit(main())
