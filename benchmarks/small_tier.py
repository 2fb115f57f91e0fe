"""Training with a RAM tier smaller than the table, against one that holds it all: same AUC, and the speed kept.

    python benchmarks/small_tier.py [--small 2M] [--large 2G] [--repeats 3] [--shards 2] [--train-args "..."]

The demo's job (`python3 dev.py demo`: FM, numpy, 2,000,000 synthetic rows with a planted model, the large-data
recipe, 100,000 eval rows, seed 0) runs against --shards servers started by worker.cluster.LocalCluster with
`--cache-bytes` --small per shard, then against servers with --large per shard (everything in RAM), in turn,
--repeats times (small, large, small, large, ...), so a change in this shared machine's speed hits both alike.
Each run is `python -m worker train --servers ...` with the demo's defaults (plus --train-args), on fresh data
dirs; its figures come from --metrics-out: examples/s (training only, eval excluded), eval AUC and logloss, and
the planted model's (the oracle). After each run, before the servers stop, each server's Stats give its table's
rows, rows in RAM, RAM tier bytes, cache misses (ids read from RocksDB) and evictions, and /proc its peak RSS
and the CPU seconds (user + system) it used from the job's start until it went idle after it.
In the large runs the misses are the first lookups of new ids only (evictions 0); the small runs' extra misses
are rows the tier had to drop and read back; the servers' extra CPU is mostly those reads and the writes of the
evicted rows (CPU, unlike wall time, is hardly moved by other work on a shared machine).

Rows that fit in the small tier: its budget over the bytes per row in RAM of the large run (ram_bytes /
rows_in_ram). The data dirs are on this machine's disk (/tmp); a table of this size stays in the page cache, so
a miss reads RocksDB's files from memory, not from the device.

Before the measured runs, one short job of each kind (--max-examples WARMUP_EXAMPLES) is run and not counted:
the compiled loops (numba, cached on disk) are compiled on the first call of a fresh checkout, and the small
tier's eviction loops only by a job that evicts, so without it the first small run would pay for compiling.

Target: small examples/s (median) >= 0.8x the large runs' median, every small run's eval AUC within 1e-4 of
every large run's. Training is deterministic (one worker, seeded data and initializers, prefetched rows corrected
by the rows the pushes return), so the AUCs are expected to be equal; the difference is printed. The last line
is one JSON object (harness.emit).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import harness  # before numpy: see its docstring

from ps.terminate import how_it_ended
from worker.client import Client
from worker.cluster import LocalCluster

TARGET_RATIO = 0.8
AUC_TOLERANCE = 1e-4  # training is deterministic: the AUCs are expected to be equal
WARMUP_EXAMPLES = 100_000  # a warm-up job's training examples: enough to evict in the small tier
TABLE = "fm"  # the demo model's sparse table


def server_stats(addresses: list[str], pids: list[int], cpu_before: list[float]) -> list[dict]:
    """Per server: the sparse table's counts from Stats, the RAM tier budget, the peak RSS, and the CPU seconds it
    used since cpu_before (its start-up excluded), once idle (its write-behind's last writes included), in all and
    by thread name since it started (harness.thread_cpu_s)."""
    out = []
    for pid in pids:
        if not harness.wait_idle(pid):
            print(f"  note: server {pid} was still busy 10 s after the job: its CPU figure leaves out what it did "
                  "after", flush=True)  # fmt: skip
    with Client(addresses) as client:
        for response, pid, before in zip(client.stats(), pids, cpu_before, strict=True):
            table = next(t for t in response.tables if t.name == TABLE)
            out.append({"num_rows": table.num_rows, "rows_in_ram": table.rows_in_ram, "ram_bytes": table.ram_bytes,
                        "cache_misses": table.cache_misses, "evictions": table.evictions,
                        "ram_budget_bytes": response.ram_budget_bytes,
                        "peak_rss_bytes": harness.peak_rss_bytes(pid), "cpu_s": harness.cpu_s(pid) - before,
                        "thread_cpu_s": harness.thread_cpu_s(pid)})  # fmt: skip
    return out


def train_run(shards: int, cache_bytes: str, train_args: list[str]) -> dict:
    """One demo job against fresh servers with --cache-bytes cache_bytes: its metrics, and each server's stats."""
    with tempfile.TemporaryDirectory(prefix="sparseps-small-tier-") as tmp:
        out = os.path.join(tmp, "metrics.json")
        with LocalCluster(shards, root=os.path.join(tmp, "shards"), extra_args=["--cache-bytes", cache_bytes]) as c:
            cmd = [sys.executable, "-m", "worker", "train", "--servers", ",".join(c.addresses), "--no-progress",
                   "--metrics-out", out, *train_args]  # fmt: skip
            cpu_before = [harness.cpu_s(p.pid) for p in c.procs]
            started = time.perf_counter()
            run = subprocess.run(cmd, cwd=harness.ROOT, capture_output=True, text=True)
            wall = time.perf_counter() - started
            if run.returncode != 0:
                raise SystemExit(
                    f"{shlex.join(cmd)} {how_it_ended(run.returncode)}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
                )
            servers = server_stats(c.addresses, [p.pid for p in c.procs], cpu_before)
        with open(out) as f:
            metrics = json.load(f)
    keep = ("examples_per_s", "train_examples", "train_seconds", "eval_auc", "eval_logloss", "oracle_auc",
            "oracle_logloss", "table_rows")  # fmt: skip
    cpu = sum(s["cpu_s"] for s in servers)  # the shards', in all
    return {**{k: metrics.get(k) for k in keep}, "wall_s": wall, "cpu_s": cpu, "servers": servers}


def summarize(name: str, runs: list[dict]) -> dict:
    rates = [r["examples_per_s"] for r in runs]
    last = runs[-1]["servers"]
    return {"cache_bytes": name, "examples_per_s": statistics.median(rates), "runs": rates,
            "eval_auc": statistics.median(r["eval_auc"] for r in runs), "eval_aucs": [r["eval_auc"] for r in runs],
            "eval_logloss": statistics.median(r["eval_logloss"] for r in runs),
            "cpu_s": statistics.median(r["cpu_s"] for r in runs), "cpu_s_runs": [r["cpu_s"] for r in runs],
            "oracle_auc": runs[0]["oracle_auc"], "servers": last}  # fmt: skip


def table_lines(small_name: str, small: dict, large: dict) -> tuple[float, int]:
    """Prints the table's size against the small tier, each server's counts and the rates; returns (RAM bytes per
    row, rows a small tier holds)."""
    servers = large["servers"]
    trained, held = [s["num_rows"] for s in servers], [s["rows_in_ram"] for s in servers]
    per_row = sum(s["ram_bytes"] for s in servers) / max(1, sum(held))  # nothing evicted: every row in RAM
    fits = int(small["servers"][0]["ram_budget_bytes"] // per_row)
    print(f"\ntable {TABLE}: {sum(trained):,} trained rows ({', '.join(f'{n:,}' for n in trained)} per server); "
          f"{sum(held):,} rows in RAM with nothing evicted ({', '.join(f'{n:,}' for n in held)}; ids pulled for "
          f"eval only included), {per_row:.0f} bytes each: a {small_name} tier holds about {fits:,} rows per "
          f"server, {fits / max(held):.0%} of the largest server's")  # fmt: skip
    print(f"{'per server':<18} {'rows':>9} {'in RAM':>9} {'RAM bytes':>11} {'misses':>11} {'evictions':>11} "
          f"{'peak RSS':>10} {'CPU':>7}")  # fmt: skip
    for leg in (small, large):
        for i, s in enumerate(leg["servers"]):
            print(f"{leg['cache_bytes'] + f' shard {i}':<18} {s['num_rows']:>9,} {s['rows_in_ram']:>9,} "
                  f"{s['ram_bytes']:>11,} {s['cache_misses']:>11,} {s['evictions']:>11,} "
                  f"{s['peak_rss_bytes'] / (1 << 20):>6,.0f} MiB {s['cpu_s']:>5.1f} s")  # fmt: skip
    print(f"\n{'--cache-bytes':<14} {'examples/s (median)':>20} {'runs':>26} {'eval AUC':>9} {'oracle':>8} "
          f"{'shards CPU s (median)':>22}")  # fmt: skip
    for leg in (small, large):
        each = ", ".join(f"{x:,.0f}" for x in leg["runs"])
        print(f"{leg['cache_bytes']:<14} {leg['examples_per_s']:>20,.0f} {each:>26} {leg['eval_auc']:>9.6f} "
              f"{leg['oracle_auc']:>8.4f} {leg['cpu_s']:>22.1f}")  # fmt: skip
    return per_row, fits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", default="2M", help="--cache-bytes of each server in the small-tier runs")
    p.add_argument("--large", default="2G", help="--cache-bytes of each server in the runs that hold it all")
    p.add_argument("--repeats", type=int, default=3, help="runs of each, alternated")
    p.add_argument("--shards", type=int, default=2, help="local servers, as the demo starts")
    p.add_argument("--train-args", default="", help="extra `ps-worker train` flags (default: the demo's settings)")
    args = p.parse_args(argv)
    train_args = shlex.split(args.train_args)
    legs = {"small": args.small, "large": args.large}
    print(f"== the demo's job ({' '.join(train_args) or 'defaults'}), {args.shards} shards, --cache-bytes "
          f"{args.small} vs {args.large} per shard, alternated x{args.repeats} (which goes first swaps each time); "
          f"{os.cpu_count()} cores, shared ==",
          flush=True)  # fmt: skip
    for name, cache in legs.items():
        m = train_run(args.shards, cache, [*train_args, "--max-examples", str(WARMUP_EXAMPLES)])
        print(f"  warm-up {name:<5} {cache:>4}  {m['train_examples']:,} examples, not counted ({m['wall_s']:.0f} s)",
              flush=True)  # fmt: skip
    runs: dict[str, list[dict]] = {name: [] for name in legs}
    for r in range(args.repeats):
        order = list(legs.items())[:: -1 if r % 2 else 1]  # each leg first in every other pair: a drift in the
        for name, cache in order:  # machine's speed over the runs hits both alike
            m = train_run(args.shards, cache, train_args)
            runs[name].append(m)
            misses = sum(s["cache_misses"] for s in m["servers"])
            evictions = sum(s["evictions"] for s in m["servers"])
            print(f"  run {r + 1} {name:<5} {cache:>4}  {m['examples_per_s']:>9,.0f} examples/s  AUC "
                  f"{m['eval_auc']:.6f}  misses {misses:>10,}  evictions {evictions:>10,}  "
                  f"shards' CPU {m['cpu_s']:4.1f} s  ({m['wall_s']:.0f} s)",
                  flush=True)  # fmt: skip
    small, large = summarize(args.small, runs["small"]), summarize(args.large, runs["large"])
    per_row, fits = table_lines(args.small, small, large)
    ratio = small["examples_per_s"] / large["examples_per_s"]
    auc_diff = small["eval_auc"] - large["eval_auc"]
    worst_diff = max(abs(a - b) for a in small["eval_aucs"] for b in large["eval_aucs"])
    met = ratio >= TARGET_RATIO and worst_diff <= AUC_TOLERANCE
    paired = [a / b for a, b in zip(small["runs"], large["runs"], strict=True)]
    print(f"small/large examples/s, run by run: {', '.join(f'{x:.2f}' for x in paired)} (the target uses the medians)")
    print(f"AUC difference small - large: {auc_diff:+.2e} (largest over all pairs of runs {worst_diff:.2e})")
    print(f"target: small-tier examples/s >= {TARGET_RATIO}x the large tier's, AUC within {AUC_TOLERANCE:g}: "
          f"{ratio:.2f}x, {'met' if met else 'MISSED'}")  # fmt: skip
    harness.emit({"cores": os.cpu_count(), "shards": args.shards, "small": small, "large": large,
                  "rows_fitting_small_tier_per_server": fits, "ram_bytes_per_row": per_row, "ratio": ratio,
                  "paired_ratios": paired, "auc_diff": auc_diff, "auc_diff_max": worst_diff,
                  "target_ratio": TARGET_RATIO, "met": met})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
