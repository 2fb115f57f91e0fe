"""The push update path in one process, this tree against another (the code it replaces), run alternately.

    python benchmarks/push_kernel.py --base /tmp/base-tree [--rounds 3] [--reps 15]

A hot table (every row in the RAM tier) of --rows ids, dim 16, Adagrad, in an in-process Shard; each call
pushes --ids distinct random ids. Three figures per tree, ms per call:
    push     Shard.push_batch of one push with the default counts, 1 show and 0 clicks per id, as the client
             sends most (validation, the in-place update, the journal append)
    chunked  the same push with the table made to take it in chunks of --chunk ids (buffered update, commit)
    replay   Table.replay of a journal record of --ids ids newer than every row (start-up's path)
Each round runs one child process per tree (PYTHONPATH set to the tree), alternating, so a change in this
shared machine's speed hits both alike; a child warms up (numba compiles or loads its caches) before timing.
The flusher is kept idle, so only the push path is timed. Without --base, one child runs on this tree.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = ("push", "chunked", "replay")


def child(args: argparse.Namespace) -> None:
    """Runs in the tree on PYTHONPATH: prints {figure: [seconds per call]} as one JSON line."""
    import ps
    from ps.config import OptimizerConfig, TableConfig

    try:
        from ps.server_config import ServerConfig
    except ImportError:  # a tree from before ServerConfig had a module of its own
        from ps.config import ServerConfig

    tree = os.path.dirname(os.path.abspath(ps.__path__[0]))
    if os.path.isdir(os.path.join(tree, "ps", "engine")):  # the layered tree (asked by path: an editable install
        from ps.engine.shard import Shard  # of another tree could answer an import that this tree lacks)
        from ps.storage.journal import Record  # defined in journalformat.py, imported into journal.py: this name
        # reads in the layered trees from before journalformat.py was split out too
    else:  # a tree from before ps/ was split into layers
        from ps.journal import Record
        from ps.shard import Shard
    for cls in (Shard, Record):
        where = sys.modules[cls.__module__].__file__
        assert where.startswith(tree + os.sep), f"{cls.__name__} came from {where}, not from {tree}"

    data_dir = tempfile.mkdtemp(prefix="push-kernel-")
    cfg = ServerConfig(data_dir=data_dir, cache_bytes=2 << 30, flush_interval_s=3600, journal_flush_bytes=1 << 50)
    shard = Shard(cfg)
    shard.create_table(TableConfig("hot", 16, optimizer=OptimizerConfig("adagrad", 0.05)))
    table = shard.table("hot")
    for lo in range(0, args.rows, 500_000):  # every row into the RAM tier
        shard.pull("hot", np.arange(lo, min(lo + 500_000, args.rows), dtype=np.uint64))
    rng = np.random.default_rng(0)
    batches = [rng.choice(args.rows, args.ids, replace=False).astype(np.uint64) for _ in range(8)]
    grads = (rng.standard_normal((args.ids, 16)) * 0.01).astype(np.float32)
    shows, clicks = np.ones(args.ids, np.float32), np.zeros(args.ids, np.float32)
    calls = {"n": 0}
    replay_seq = [1 << 40]  # newer than any row's lsn: every row of the record is updated

    def push() -> None:
        calls["n"] += 1
        shard.push_batch([("hot", batches[calls["n"] % 8], grads)])  # the default counts: none given

    def chunked() -> None:
        table.arena.max_pinnable = lambda: args.chunk  # the table takes the push in chunks of this many ids
        try:
            push()
        finally:
            del table.arena.max_pinnable

    def replay() -> None:
        calls["n"] += 1
        replay_seq[0] += 1
        table.replay(Record(replay_seq[0], "hot", batches[calls["n"] % 8], grads, shows, clicks, 1))

    fns = {"push": push, "chunked": chunked, "replay": replay}
    for _ in range(3):  # compile or load the numba caches, touch the rows
        for fn in fns.values():
            fn()
    out = {k: {"wall": [], "cpu": []} for k in fns}
    for _ in range(args.reps):
        for k, fn in fns.items():
            t, c = time.perf_counter(), time.process_time()
            fn()
            out[k]["wall"].append(time.perf_counter() - t)
            out[k]["cpu"].append(time.process_time() - c)
    shutil.rmtree(data_dir, ignore_errors=True)
    print(json.dumps(out), flush=True)
    os._exit(0)  # skip the close's final flush of every dirty row: not part of what is measured


def run_child(tree: str, args: argparse.Namespace) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--ids", str(args.ids), "--rows", str(args.rows),
           "--reps", str(args.reps), "--chunk", str(args.chunk)]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"child on {tree} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(wall: list[float], cpu: list[float]) -> dict:
    ms = sorted(1e3 * s for s in wall)
    q = lambda p: round(ms[min(len(ms) - 1, int(p * len(ms)))], 2)
    return {"median_ms": round(statistics.median(ms), 2), "p10_ms": q(0.1), "p90_ms": q(0.9), "min_ms": q(0),
            "max_ms": q(1), "cpu_median_ms": round(1e3 * statistics.median(cpu), 2), "n": len(ms)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", help="another tree (e.g. a git worktree of the code this one replaces)")
    p.add_argument("--rounds", type=int, default=3, help="alternations: one child per tree per round")
    p.add_argument("--reps", type=int, default=15, help="timed calls of each figure per child")
    p.add_argument("--ids", type=int, default=100_000)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--chunk", type=int, default=50_000)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    trees = {"this": HERE} | ({"base": os.path.abspath(args.base)} if args.base else {})
    samples = {t: {k: {"wall": [], "cpu": []} for k in FIGURES} for t in trees}
    per_round = {t: {k: [] for k in FIGURES} for t in trees}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(trees)[::-1]  # who goes first alternates too
        for t in order:
            got = run_child(trees[t], args)
            for k in FIGURES:
                for clock in ("wall", "cpu"):
                    samples[t][k][clock] += got[k][clock]
                per_round[t][k].append(round(1e3 * statistics.median(got[k]["wall"]), 2))
            print(
                f"round {r + 1} {t:4}: " + "  ".join(f"{k} {per_round[t][k][-1]:.2f} ms" for k in FIGURES), flush=True
            )
    result = {t: {k: summary(**samples[t][k]) | {"round_medians_ms": per_round[t][k]} for k in FIGURES} for t in trees}
    print(f"\nms per call of {args.ids:,} ids (dim 16, Adagrad, {args.rows:,} hot rows): wall median [p10-p90], "
          f"and the process's CPU time (all threads) median, over {args.rounds} rounds x {args.reps} calls")  # fmt: skip
    print(f"{'':8}" + "".join(f"{t + ' (' + trees[t] + ')':>40}" for t in trees))
    for k in FIGURES:
        cells = [result[t][k] for t in trees]
        print(f"{k:8}" + "".join(f"{c['median_ms']:.2f} [{c['p10_ms']:.2f}-{c['p90_ms']:.2f}] cpu {c['cpu_median_ms']:.2f}".rjust(40) for c in cells))  # fmt: skip
    if "base" in trees:
        ratios = {k: round(result["this"][k]["median_ms"] / result["base"][k]["median_ms"], 3) for k in FIGURES}
        print("this / base (wall medians): " + "  ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
        result["ratio_this_over_base"] = ratios
    print(json.dumps(result))


if __name__ == "__main__":
    main()
