"""Hot PullBatch and PushBatch throughput of one server process, server-only and end to end through the client,
next to a bare gRPC round trip of the same bytes, with the server's CPU per call.

    python benchmarks/pull_push.py [--ids 100000] [--dim 16] [--rows 2000000] [--reps 50] [--return-rows]

A table of --rows rows (dim 16, Adagrad) is admitted to the RAM tier by pulls; then each call pulls (or pushes)
--ids distinct random ids of it (one of BATCHES such sets, drawn once and used in turn; every row is in RAM
either way), through the batch RPCs the trainer uses, one shard:
- server only: PullBatch / PushBatch request bytes built before the call as worker/client.py builds them
  (harness.pull_batch_bytes, push_batch_body; each push with its own client id and seq, so each is applied), the
  reply's bytes left unparsed: what the call costs beyond the transport is the server's.
- end to end: worker.client.Client.pull / .push with the ids in random order, as a user calls them: dedup and
  sort, request building, routing and reply decoding included.
- reference: an echo server in its own process (harness.EchoServer) that receives the server-only request's
  bytes and answers with as many bytes as the server's reply, no protobuf and no work.
The three alternate (server only, end to end, echo, server only, ...), so a change in this shared machine's speed
hits them alike. Server CPU is read from /proc/PID/stat (all threads; clock ticks, averaged over the reps) before
each server call, after its reply, and once the server is idle again (at most one tick in two 0.1 s windows);
"after the reply" is the deferred work (journal preparation, flushing) the call caused. Each echo call starts
only once the server is idle, so no deferred work lands in its window.
--return-rows: pushes ask for their rows back (return_rows), as the trainer's step does; the echo reply grows
to match.
Targets: server-only pull >= 50% and push >= 40% of the echo rates.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
from collections.abc import Callable

import harness  # before numpy: see its docstring
import numpy as np
from harness import Leg

from protos import ps_pb2
from ps.accel.malloc import tune_malloc
from ps.config import TableConfig
from worker.client import Client
from worker.cluster import LocalCluster

BATCHES = 8


def legs_for(kind: str, server_request: Callable[[int], bytes], server_call: Callable[[bytes], bytes],
             client_call: Callable[[int], object], echo_call: Callable[[object], bytes], pid: int) -> list[Leg]:  # fmt: skip
    """Server-only, end-to-end and echo legs of one kind of call: server_request(k) builds the bytes of server
    call k (untimed), server_call(bytes) sends them; client_call(k) makes end-to-end call k."""
    k, j = iter(range(10**9)), iter(range(10**9))
    return [
        Leg(f"{kind} server only", server_call, prepare=lambda: server_request(next(k)), cpu_pid=pid),
        Leg(f"{kind} end to end", client_call, prepare=lambda: next(j), cpu_pid=pid),
        Leg(f"echo of the {kind}'s bytes", echo_call, idle_pid=pid),
    ]


def summary(n: int, legs: list[Leg]) -> dict:
    server, e2e, echo = legs
    cpu_in, cpu_after = server.cpu_ms()
    e2e_in, e2e_after = e2e.cpu_ms()
    kind = server.name.split()[0]
    return {
        f"{kind}_ids_per_s": harness.rate(n, server.seconds),
        f"{kind}_e2e_ids_per_s": harness.rate(n, e2e.seconds),
        f"echo_{kind}_ids_per_s": harness.rate(n, echo.seconds),
        f"{kind}_vs_echo": harness.rate(n, server.seconds) / harness.rate(n, echo.seconds),
        f"{kind}_e2e_vs_echo": harness.rate(n, e2e.seconds) / harness.rate(n, echo.seconds),
        f"{kind}_wall_ms": 1e3 * statistics.median(server.seconds),
        f"{kind}_server_cpu_ms_to_reply": cpu_in,
        f"{kind}_server_cpu_ms_after_reply": cpu_after,
        f"{kind}_e2e_server_cpu_ms_to_reply": e2e_in,
        f"{kind}_e2e_server_cpu_ms_after_reply": e2e_after,
        f"{kind}_reps": len(server.seconds),
        f"{kind}_waits_not_idle": sum(leg.not_idle for leg in legs),
    }


def report(n: int, legs: list[Leg]) -> None:
    server, e2e, echo = legs
    echo_rate = harness.rate(n, echo.seconds)
    for leg in legs:
        line = f"{leg.name + ':':<32} {harness.spread(n, leg.seconds)} ids/s"
        if leg.cpu_pid is not None:
            cpu_in, cpu_after = leg.cpu_ms()
            wall_ms = 1e3 * statistics.median(leg.seconds)
            line += (f" -> {harness.rate(n, leg.seconds) / echo_rate:.0%} of echo; server CPU per call "
                     f"{cpu_in:.1f} ms to the reply + {cpu_after:.1f} ms after it, wall {wall_ms:.1f} ms")  # fmt: skip
        print(line)
    if server.not_idle + e2e.not_idle + echo.not_idle:
        print(f"  ({server.not_idle + e2e.not_idle + echo.not_idle} waits for an idle server hit their deadline)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ids", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--return-rows", action="store_true", help="pushes ask for their rows back, as training does")
    args = p.parse_args()
    tune_malloc()
    rng = np.random.default_rng(0)
    n, dim = args.ids, args.dim
    batches = [rng.choice(args.rows, n, replace=False).astype(np.uint64) for _ in range(BATCHES)]  # random order
    grads = [(rng.standard_normal((n, dim)) * 0.01).astype(np.float32) for _ in range(BATCHES)]
    order = [np.argsort(b) for b in batches]  # the client sends ids sorted, their grads in the same order

    with (
        LocalCluster(1, extra_args=["--cache-bytes", "4G"]) as cluster,
        harness.EchoServer() as echo,
        Client(cluster.addresses) as client,
    ):
        client.wait_ready()
        pid = cluster.procs[0].pid
        client.create_table(TableConfig(name="hot", dim=dim))
        for lo in range(0, args.rows, 500_000):  # a pull admits rows to RAM, without making them dirty
            client.pull("hot", np.arange(lo, min(lo + 500_000, args.rows), dtype=np.uint64))
        ch = harness.channel(cluster.addresses[0])
        pull_batch, push_batch = harness.raw_method(ch, "PullBatch"), harness.raw_method(ch, "PushBatch")
        pulls = [harness.pull_batch_bytes("hot", b[o]) for b, o in zip(batches, order)]
        bodies = [
            harness.push_batch_body("hot", b[o], g[o], args.return_rows) for b, g, o in zip(batches, grads, order)
        ]
        raw_client, seq = secrets.randbits(63) | 1, iter(range(1, 10**9))

        reply = ps_pb2.PullBatchResponse.FromString(pull_batch(pulls[0])).replies[0]
        assert len(reply.rows) == 4 * n * dim and reply.dim == dim, "the server-only pull gets real rows"
        pushed = ps_pb2.PushBatchResponse.FromString(
            push_batch(bodies[0] + harness.push_batch_tail(raw_client, next(seq)))
        )
        assert pushed.num_applied == n, f"a server-only push applied {pushed.num_applied} of {n} ids"
        pull_reply_bytes = len(pull_batch(pulls[0]))
        push_reply_bytes = len(push_batch(bodies[0] + harness.push_batch_tail(raw_client, next(seq))))

        echo_pull = echo.request(len(pulls[0]), pull_reply_bytes)
        pull_legs = harness.alternate(legs_for(
            "pull",
            lambda k: pulls[k % BATCHES],
            pull_batch,
            lambda k: client.pull("hot", batches[k % BATCHES]),
            lambda _: echo.round_trip(echo_pull),
            pid,
        ), args.reps)  # fmt: skip

        def client_push(k: int) -> None:
            if args.return_rows:
                client.push_many([("hot", batches[k % BATCHES], grads[k % BATCHES], None)], return_rows=True)
            else:
                client.push("hot", batches[k % BATCHES], grads[k % BATCHES])

        push_bytes = len(bodies[0] + harness.push_batch_tail(raw_client, args.reps))  # a seq of the timed calls
        echo_push = echo.request(push_bytes, push_reply_bytes)
        push_legs = harness.alternate(legs_for(
            "push",
            lambda k: bodies[k % BATCHES] + harness.push_batch_tail(raw_client, next(seq)),
            push_batch,
            client_push,
            lambda _: echo.round_trip(echo_push),
            pid,
        ), args.reps)  # fmt: skip

    r = {"ids_per_request": n, "dim": dim, "table_rows": args.rows, "return_rows": args.return_rows}
    r.update(summary(n, pull_legs))
    r.update(summary(n, push_legs))
    print(f"{n:,} ids x dim {dim} per call, table of {args.rows:,} hot rows, one server process; "
          f"calls alternated{', pushes return their rows' if args.return_rows else ''}")  # fmt: skip
    report(n, pull_legs)
    report(n, push_legs)
    harness.emit(r)


if __name__ == "__main__":
    sys.exit(main())
