"""Training modes and dense paths, measured: 2 workers and 2 local shards started by `ps-worker launch`.

    python benchmarks/train_modes.py [--rows 1000000] [--dense-rows 100000] [--repeats 3] [--only modes|dense]

Part 1, modes: FM (numpy workers) on --rows synthetic rows with a planted model, one epoch at batch 1024, in each
--mode: async, sync, ssp (staleness 4, its 64 MiB row cache) and geo (every 4 steps), --repeats times, the modes'
order rotated each time (so no mode always runs first or last). Each line gives the median of the job's
examples/s (all examples over the slowest worker's training time), the eval AUC on 100,000 held-out rows next to
the planted model's (the oracle), and the worker row cache's hit rate where a mode has one.
Target: async, ssp and geo within 0.01 of the oracle AUC.

Part 2, dense paths: on --dense-rows rows at batch 256, FM (no MLP) against DeepFM (MLP 400-400-400) with the MLP
  ps-inline    on the servers, pushed and fetched in every step (--dense-staleness 0)
  ps-stale2    on the servers, pushed and fetched on a background thread, at most 2 steps behind
  allreduce    on each torch worker, gradients averaged by torch.distributed (gloo)
FM runs on numpy workers and on torch workers: each DeepFM leg is compared with the FM of its own backend (numpy
for ps-inline and ps-stale2, torch for allreduce). Every leg runs on the same data with the same settings; the
runs alternate --repeats times and the medians are compared, since this 2-core machine's speed varies by +-20%
from one run to the next.
Target: DeepFM with the background or allreduce path >= 0.6 of its backend's FM's examples/s.

Both parts run every worker and shard on this machine's cores: the figures are of a 2-core job, not of a cluster.
The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODES = {
    "async": ["--mode", "async"],
    "sync": ["--mode", "sync"],
    "ssp": ["--mode", "ssp", "--staleness", "4"],
    "geo": ["--mode", "geo", "--geo-every", "4"],
}
DENSE = {
    "fm": ("numpy", ["--model", "fm"]),
    "fm torch": ("torch", ["--model", "fm"]),
    "deepfm ps-inline": ("numpy", ["--model", "deepfm", "--dense-staleness", "0"]),
    "deepfm ps-stale2": ("numpy", ["--model", "deepfm", "--dense-staleness", "2"]),
    "deepfm allreduce": ("torch", ["--model", "deepfm", "--dense", "allreduce"]),
}
REFERENCE = {"numpy": "fm", "torch": "fm torch"}  # each leg's FM: the one of its backend


def launch(workers: int, backend: str, args: list[str], rows: int, eval_rows: int, batch: int) -> dict:
    """One `ps-worker launch` job on local shards; its merged metrics, with the wall time."""
    with tempfile.TemporaryDirectory(prefix="sparseps-modes-") as tmp:
        out = os.path.join(tmp, "metrics.json")
        cmd = [sys.executable, "-m", "worker", "launch", "--workers", str(workers), "--backends", backend,
               "--local-shards", "2", "--metrics-out", out, "--no-progress", "--recipe", "large",
               "--synthetic-rows", str(rows), "--synthetic-eval-rows", str(eval_rows), "--batch-size", str(batch),
               *args]  # fmt: skip
        started = time.perf_counter()
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if run.returncode != 0:
            raise SystemExit(f"failed ({run.returncode}): {' '.join(cmd)}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        with open(out) as f:
            metrics = json.load(f)
    metrics.pop("per_worker", None)
    metrics["wall_s"] = wall
    return metrics


def modes_part(rows: int, repeats: int) -> dict:
    print(f"== modes: FM, 2 numpy workers, 2 shards, {rows:,} rows, batch 1024, one epoch, x{repeats} in rotated "
          "order ==", flush=True)  # fmt: skip
    runs: dict[str, list[dict]] = {name: [] for name in MODES}
    names = list(MODES)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            m = launch(2, "numpy", MODES[name], rows, 100_000, 1024)
            runs[name].append(m)
            print(f"  run {r + 1} {name:<6} {m['examples_per_s']:>9,.0f} examples/s  AUC {m['eval_auc']:.4f}",
                  flush=True)  # fmt: skip
    print(f"{'mode':<8} {'examples/s':>11} {'eval AUC':>9} {'oracle':>8} {'gap':>8} {'cache hits':>10}  (medians)")
    out = {}
    for name, ms in runs.items():
        rate, auc = (statistics.median(m[key] for m in ms) for key in ("examples_per_s", "eval_auc"))
        oracle = ms[0]["oracle_auc"]
        hit = [m["cache_hit_rate"] for m in ms if m.get("cache_hit_rate") is not None]
        hits = f"{statistics.median(hit):.1%}" if hit else "-"
        print(f"{name:<8} {rate:>11,.0f} {auc:>9.4f} {oracle:>8.4f} {oracle - auc:>+8.4f} {hits:>10}", flush=True)
        out[name] = {"examples_per_s": rate, "eval_auc": auc, "oracle_auc": oracle, "gap": oracle - auc,
                     "cache_hit_rate": statistics.median(hit) if hit else None,
                     "runs": [m["examples_per_s"] for m in ms]}  # fmt: skip
    met = all(out[m]["gap"] <= 0.01 for m in ("async", "ssp", "geo"))
    print(f"target: async, ssp and geo within 0.01 of the oracle AUC: {'met' if met else 'MISSED'}")
    return out


def dense_part(rows: int, repeats: int) -> dict:
    print(f"\n== dense paths: 2 workers, 2 shards, {rows:,} rows, batch 256, runs alternated x{repeats} ==", flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in DENSE}
    for r in range(repeats):  # each path first in turn: a drift in the machine's speed hits them alike
        for name, (backend, args) in list(DENSE.items())[r % len(DENSE) :] + list(DENSE.items())[: r % len(DENSE)]:
            m = launch(2, backend, args, rows, 20_000, 256)
            runs[name].append(m)
            print(f"  run {r + 1} {name:<17} {m['examples_per_s']:>9,.0f} examples/s  AUC {m['eval_auc']:.4f}",
                  flush=True)  # fmt: skip
    rates = {name: statistics.median(m["examples_per_s"] for m in ms) for name, ms in runs.items()}
    print(f"{'model, MLP path':<20} {'backend':>7} {'examples/s (median)':>20} {'of its FM':>9} {'eval AUC':>9}")
    out = {}
    for name, ms in runs.items():
        backend = DENSE[name][0]
        rate, of_fm = rates[name], rates[name] / rates[REFERENCE[backend]]
        auc = statistics.median(m["eval_auc"] for m in ms)
        print(f"{name:<20} {backend:>7} {rate:>20,.0f} {of_fm:>9.2f} {auc:>9.4f}")
        out[name] = {"examples_per_s": rate, "backend": backend, "of_fm": of_fm, "of_numpy_fm": rate / rates["fm"],
                     "eval_auc": auc, "runs": [m["examples_per_s"] for m in ms]}  # fmt: skip
    best = max(out["deepfm ps-stale2"]["of_fm"], out["deepfm allreduce"]["of_fm"])
    print(f"target: DeepFM with the background or allreduce path >= 0.6 of its backend's FM: {best:.2f} "
          f"{'met' if best >= 0.6 else 'MISSED'}")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="synthetic rows of the modes part")
    p.add_argument("--dense-rows", type=int, default=100_000, help="synthetic rows of the dense part")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", choices=["modes", "dense"], default=None)
    args = p.parse_args(argv)
    result: dict = {"cores": os.cpu_count()}
    if args.only in (None, "modes"):
        result["modes"] = modes_part(args.rows, args.repeats)
    if args.only in (None, "dense"):
        result["dense"] = dense_part(args.dense_rows, args.repeats)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
