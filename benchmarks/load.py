"""A bounded load test: 8 client processes train against one ps-server process on 127.0.0.1 for 60 s; errors,
latency per method, and the server's peak RSS against the memory it is configured to use.

    python benchmarks/load.py                  # 8 clients x 60 s, --cache-bytes 64M
    python benchmarks/load.py --seconds 20

One server (worker.cluster.LocalCluster: `python -m ps` on loopback) holds two tables, "fm" (dim 16, Adagrad)
and "lr" (dim 1, FTRL). Each client is its own process with its own worker.client.Client (no retries: every
failed call counts) and runs training steps: draw a batch of --batch examples x 26 ids with Zipf(1.1)
frequencies over --rows ids, pull both tables' rows (Client.pull_many: one PullBatch), then push gradients
and clicks for them with a clock advance (Client.push_many: one PushBatch with the client's id and its request
number). The clients start together once all are ready and stop by themselves after --seconds; the latency of a
method is that of the Client call (dedup, request, reply), as a trainer sees it.

Memory: the server's peak RSS (VmHWM, /proc/PID/status: the largest it ever was, start-up included), read before
it stops, against the memory it is configured to use: the RAM tier (--cache-bytes), RocksDB's block cache
(ps.storage.options.BLOCK_CACHE_BYTES), and its memtables, per column family write_buffer_size x
max_write_buffer_number as ps.storage.options.rocksdb_options sets them, read from the OPTIONS file RocksDB wrote
in the server's data dir; plus 300 MiB for the interpreter, its libraries and gRPC's buffers.
PASS: every client finished, 0 errors, and peak RSS within that bound. The exit status is 0 for PASS, 1 for
FAIL; the last line is one JSON object (harness.emit).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import threading
import time

import harness  # before numpy: see its docstring
import numpy as np

from ps.cli_server_flags import parse_bytes
from ps.config import OptimizerConfig, TableConfig
from ps.errors import PsError
from ps.storage.options import BLOCK_CACHE_BYTES
from worker.client import Client
from worker.cluster import LocalCluster

FIELDS = 26  # ids per example (the Criteo schema's categorical fields)
TABLES = [TableConfig("fm", 16, optimizer=OptimizerConfig("adagrad", 0.05)), TableConfig("lr", 1, optimizer=OptimizerConfig("ftrl", 0.05))]  # fmt: skip
HEADROOM_BYTES = 300 << 20
METHODS = ("PullBatch", "PushBatch")


# ---- one client process -------------------------------------------------------------------------------------
def client_main(args: argparse.Namespace) -> None:
    """Connects, warms up, says `ready`, waits for `go` on stdin, trains for --seconds; prints one JSON line."""
    rng = np.random.default_rng(args.seed)
    latencies: dict[str, list[float]] = {m: [] for m in METHODS}
    errors: dict[str, int] = {}
    with Client([args.address], timeout_s=30.0, server_timeout_s=0) as client:
        client.wait_ready(60)
        step(client, rng, args)  # warm-up: connections, compiled loops, table dims
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return
        deadline = time.monotonic() + args.seconds
        steps = 0
        while time.monotonic() < deadline:
            step(client, rng, args, latencies, errors)
            steps += 1
    print(json.dumps({"steps": steps, "latencies": latencies, "errors": errors}), flush=True)


def step(client: Client, rng: np.random.Generator, args: argparse.Namespace,
         latencies: dict[str, list[float]] | None = None, errors: dict[str, int] | None = None) -> None:  # fmt: skip
    """One training step: pull the batch's rows of both tables, push their gradients and clicks."""
    ids = harness.zipf_ids(rng, args.batch * FIELDS, args.rows) * np.uint64(FIELDS) + rng.integers(0, FIELDS, args.batch * FIELDS, dtype=np.uint64)  # fmt: skip
    clicks = np.repeat((rng.random(args.batch) < 0.2).astype(np.float32), FIELDS)
    calls = {
        "PullBatch": lambda: client.pull_many([(t.name, ids) for t in TABLES]),
        "PushBatch": lambda: client.push_many(
            [(t.name, ids, rng.normal(0, 0.01, (len(ids), t.dim)).astype(np.float32), clicks) for t in TABLES],
            advance_clock=1,
        ),
    }
    for method, call in calls.items():
        t0 = time.perf_counter()
        try:
            call()
        except Exception as e:  # counted, not raised: the run goes on
            if errors is None:
                raise
            key = e.status if isinstance(e, PsError) else type(e).__name__
            errors[key] = errors.get(key, 0) + 1
            continue
        if latencies is not None:
            latencies[method].append(time.perf_counter() - t0)


# ---- the run --------------------------------------------------------------------------------------------------
def memtable_bytes(data_dir: str) -> int:
    """Sum over the column families of write_buffer_size x max_write_buffer_number, from the newest OPTIONS file
    RocksDB wrote in data_dir (what ps.storage.options.rocksdb_options set)."""
    newest = max(glob.glob(os.path.join(data_dir, "OPTIONS-*")), key=lambda p: int(p.rsplit("-", 1)[1]))
    with open(newest) as f:
        sections = re.split(r"^\[", f.read(), flags=re.M)
    total = 0
    for section in sections:
        if section.startswith("CFOptions "):
            size = int(re.search(r"^\s*write_buffer_size=(\d+)", section, re.M).group(1))
            count = int(re.search(r"^\s*max_write_buffer_number=(\d+)", section, re.M).group(1))
            total += size * count
    return total


def start_clients(args: argparse.Namespace, address: str) -> list[subprocess.Popen]:
    procs = []
    for i in range(args.clients):
        cmd = [sys.executable, os.path.abspath(__file__), "client", "--address", address, "--seed", str(1000 + i),
               "--seconds", str(args.seconds), "--batch", str(args.batch), "--rows", str(args.rows)]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    return procs


def read_line(proc: subprocess.Popen, deadline: float) -> str:
    """The next line the process writes, or "" if it wrote none before the deadline (or exited)."""
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(max(0.0, deadline - time.monotonic()))
    return out[0].strip() if out else ""


def run_clients(args: argparse.Namespace, address: str) -> tuple[list[dict], int]:
    """Starts the clients, lets them go together, collects their results; (results, clients that failed)."""
    procs = start_clients(args, address)
    try:
        ready_by = time.monotonic() + 300
        ready = [read_line(p, ready_by) == "ready" for p in procs]
        print(f"  {sum(ready)} of {len(procs)} clients ready; running {args.seconds:g} s", flush=True)
        for p, ok in zip(procs, ready):
            if ok:
                p.stdin.write("go\n")
                p.stdin.flush()
        done_by = time.monotonic() + args.seconds + 120
        results = []
        for p, ok in zip(procs, ready):
            line = read_line(p, done_by) if ok else ""
            results.append(json.loads(line) if line.startswith("{") else None)
        return [r for r in results if r is not None], sum(r is None for r in results)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for pipe in (p.stdin, p.stdout):
                pipe.close()


def summarize(results: list[dict], seconds: float) -> dict:
    out: dict = {"requests": {}, "errors": {}}
    for m in METHODS:
        ms = np.array([x for r in results for x in r["latencies"][m]]) * 1e3
        out["requests"][m] = len(ms)
        out[f"{m}_p50_ms"] = float(np.percentile(ms, 50)) if len(ms) else float("nan")
        out[f"{m}_p99_ms"] = float(np.percentile(ms, 99)) if len(ms) else float("nan")
    for r in results:
        for code, n in r["errors"].items():
            out["errors"][code] = out["errors"].get(code, 0) + n
    out["steps_per_s"] = sum(r["steps"] for r in results) / seconds
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0, help="how long the clients run")
    p.add_argument("--clients", type=int, default=8, help="client processes")
    p.add_argument("--cache-bytes", type=parse_bytes, default="64M", help="the server's RAM tier (K/M/G)")
    p.add_argument("--batch", type=int, default=256, help=f"examples per step ({FIELDS} ids each)")
    p.add_argument("--rows", type=int, default=2_000_000, help="the Zipf id space of each field")
    args = p.parse_args()
    with LocalCluster(1, extra_args=["--cache-bytes", str(args.cache_bytes)]) as cluster:
        pid = cluster.procs[0].pid
        with Client(cluster.addresses, timeout_s=60) as admin:
            admin.wait_ready(60)
            for t in TABLES:
                admin.create_table(t)
            t0 = time.monotonic()
            results, failed = run_clients(args, cluster.addresses[0])
            took = time.monotonic() - t0
            peak = harness.peak_rss_bytes(pid)
            stats = admin.stats()[0]
        memtables = memtable_bytes(cluster.data_dir(0))
        alive = cluster.procs[0].poll() is None
        codes = cluster.stop()
    bound = args.cache_bytes + BLOCK_CACHE_BYTES + memtables + HEADROOM_BYTES
    s = summarize(results, args.seconds)
    errors = sum(s["errors"].values())
    ok = failed == 0 and errors == 0 and peak <= bound and alive and codes == [0]
    mib = lambda b: f"{b / 2**20:,.0f} MiB"
    print(f"{args.clients} clients x {args.seconds:g} s ({took:.0f} s with start-up): {sum(s['requests'].values()):,} "
          f"requests, {s['steps_per_s']:.1f} steps/s of {args.batch * FIELDS:,} ids; clients that did not finish: {failed}")  # fmt: skip
    print(
        f"errors: {errors}{' ' + str(s['errors']) if errors else ''}; server alive to the end: {alive}, exit code {codes}"
    )
    tier = ", ".join(f"{t.name} {t.rows_in_ram:,} rows ({t.evictions:,} evicted)" for t in stats.tables)
    print(f"RAM tier: {stats.ram_used_bytes / 2**20:,.0f} of {stats.ram_budget_bytes / 2**20:,.0f} MiB used; {tier}")
    for m in METHODS:
        print(f"  {m}: {s['requests'][m]:,} calls, p50 {s[f'{m}_p50_ms']:.1f} ms, p99 {s[f'{m}_p99_ms']:.1f} ms")
    print(f"server peak RSS {mib(peak)} vs configured {mib(bound)} = RAM tier {mib(args.cache_bytes)} + block cache "
          f"{mib(BLOCK_CACHE_BYTES)} + memtables {mib(memtables)} + {mib(HEADROOM_BYTES)}: {peak / bound:.2f}x")  # fmt: skip
    print(f"{'PASS' if ok else 'FAIL'}: 0 errors and peak RSS within the configured memory")
    harness.emit({
        "duration_s": args.seconds, "clients": args.clients, "ids_per_step": args.batch * FIELDS,
        "requests": sum(s["requests"].values()), "requests_by_method": s["requests"], "errors": errors,
        "errors_by_code": s["errors"], "clients_failed": failed, "server_exit_codes": codes,
        **{k: v for k, v in s.items() if k.endswith("_ms")}, "steps_per_s": s["steps_per_s"],
        "peak_rss_bytes": peak, "bound_bytes": bound, "cache_bytes": args.cache_bytes,
        "block_cache_bytes": BLOCK_CACHE_BYTES, "memtable_bytes": memtables, "headroom_bytes": HEADROOM_BYTES,
        "pass": ok,
    })  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__" and sys.argv[1:2] == ["client"]:
    cp = argparse.ArgumentParser()
    cp.add_argument("client")
    cp.add_argument("--address", required=True)
    for flag, kind in (("--seed", int), ("--seconds", float), ("--batch", int), ("--rows", int)):
        cp.add_argument(flag, type=kind, required=True)
    client_main(cp.parse_args())
elif __name__ == "__main__":
    sys.exit(main())
