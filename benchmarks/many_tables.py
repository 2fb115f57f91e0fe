"""CreateTable at a thousand tables: its time over the first and the last 50, and what the server holds then (RSS,
VmSize, VmPeak), next to the same at 10 tables.

    python benchmarks/many_tables.py [--tables 1000] [--dim 8] [--ids 100] [--cache-bytes 2G]

One `ps-server` process (LocalCluster, one shard, --cache-bytes as given). The script creates --tables tables of
--dim (Adagrad) one after another through Client.create_table, timing each call. After the first 10 and again
after all of them, every table created so far pulls and pushes --ids ids (so each holds rows), and then the
server's /proc/<pid>/status and Stats are read. The reference is the same server at 10 tables. No fixed target:
CreateTable at the last 50 should cost what it costs at the first 50, and the memory should follow the rows the
tables hold, not the number of tables.
"""

from __future__ import annotations

import argparse
import statistics
import time

import harness  # before numpy: see its docstring
import numpy as np

from ps.cli_server_flags import parse_bytes
from ps.config import TableConfig
from worker.client import Client
from worker.cluster import LocalCluster

MiB = 1 << 20


def status(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, VmSize and VmPeak of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "VmSize", "VmPeak"):
                out[key] = int(value.split()[0]) * 1024
    return out


def touch(client: Client, names: list[str], ids: np.ndarray, dim: int) -> None:
    """Every table pulls and pushes ids: each then holds rows in RAM, and RocksDB has its pushed rows."""
    grads = np.full((len(ids), dim), 0.01, dtype=np.float32)
    for name in names:
        client.pull(name, ids)
        client.push(name, ids, grads)


def measure(client: Client, pid: int, names: list[str], ids: np.ndarray, dim: int) -> dict[str, int]:
    touch(client, names, ids, dim)
    stats = client.stats()[0]
    return {**status(pid), "ram_used_bytes": stats.ram_used_bytes, "tables": len(stats.tables)}


def line(label: str, m: dict[str, int]) -> str:
    return (f"{label:>12}: RSS {m['VmRSS'] / MiB:7.1f} MiB (anonymous {m['RssAnon'] / MiB:7.1f})  VmSize "
            f"{m['VmSize'] / MiB:8.1f} MiB  VmPeak {m['VmPeak'] / MiB:8.1f} MiB  RAM tier {m['ram_used_bytes'] / MiB:6.1f} "
            "MiB")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tables", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--ids", type=int, default=100, help="ids each table pulls and pushes before a reading")
    ap.add_argument("--cache-bytes", default="2G", help="the server's --cache-bytes")
    args = ap.parse_args()
    if args.tables < 100:
        ap.error("--tables must be at least 100 (it compares the first and the last 50 after 10)")
    ids = np.arange(args.ids, dtype=np.uint64) * np.uint64(7919)
    print(f"{args.tables} tables of dim {args.dim} (adagrad), --cache-bytes {args.cache_bytes}, {args.ids} ids each")
    with LocalCluster(1, extra_args=["--cache-bytes", args.cache_bytes]) as cluster:
        pid = cluster.procs[0].pid
        with Client(cluster.addresses) as client:
            client.wait_ready()
            names, took = [], []
            for t in range(args.tables):
                names.append(f"t{t:05d}")
                start = time.perf_counter()
                client.create_table(TableConfig(names[-1], args.dim))
                took.append(time.perf_counter() - start)
                if t + 1 == 10:
                    at10 = measure(client, pid, names, ids, args.dim)
            at_all = measure(client, pid, names, ids, args.dim)
    first, last = [1e3 * s for s in took[:50]], [1e3 * s for s in took[-50:]]
    print(f"CreateTable, tables 1-50: median {statistics.median(first):.2f} ms, max {max(first):.2f} ms; tables "
          f"{args.tables - 49}-{args.tables}: median {statistics.median(last):.2f} ms, max {max(last):.2f} ms")  # fmt: skip
    print(line("10 tables", at10))
    print(line(f"{args.tables} tables", at_all))
    harness.emit({
        "benchmark": "many_tables", "tables": args.tables, "dim": args.dim, "ids": args.ids,
        "cache_bytes": parse_bytes(args.cache_bytes),
        "create_first50_median_ms": statistics.median(first), "create_last50_median_ms": statistics.median(last),
        "at_10": at10, "at_all": at_all,
    })  # fmt: skip


if __name__ == "__main__":
    main()
