"""How several tables share one RAM tier: misses per request of per-feature tables on one MemoryBudget, next to the
same ids in one table of the same budget (what a policy over all rows at once gets) and a perfect cache.

    python benchmarks/table_split.py [--ram-rows 48000] [--draws 4096] [--requests 400] [--warmup 200]

One shard's RAM tier at Arena level, as benchmarks/eviction.py drives it (dim 16, Adagrad, no disk): a
MemoryBudget of --ram-rows rows shared by the tables below, far fewer rows than their ids. A request is a training
batch of --draws examples with one id per table: each table gets --draws draws from its own distribution, drawn
fresh (harness.zipf_ids, ranks scattered over the ids by an odd multiplier), and is served as the Table
serves it: the pulls of every table (each of its unique ids, sorted), then the pushes of the same ids
(eviction.pull and eviction.push: misses are installed as zero rows, victims chosen by the Arena's eviction).

- split: one Arena per table on the shared budget (ps.storage.budget shares it between them);
- one table: one Arena with the whole budget serves the same ids, made disjoint by table (the table number in the
  high byte), each request's ids of all tables in one pull and one push: the reference, a single policy over
  all rows;
- perfect cache: the --ram-rows ids of highest probability over all tables (a static cache of the top ranks),
  computed from the distributions.

Misses per request are the unique ids a pull does not find in RAM, per table and in total, averaged over the
requests after --warmup (the tier fills and settles first); the rows each table holds at the end are printed
beside its fair share (--ram-rows / tables).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass

import harness  # before numpy: see its docstring
import numpy as np
from eviction import pull, push

from ps.rows.layout import layout_of
from ps.storage.arena import Arena
from ps.storage.budget import MemoryBudget

DIM = 16
OPTIMIZER = "adagrad"
TABLE_SHIFT = 56  # the one-table reference keeps table t's ids at t << TABLE_SHIFT
SCATTER = np.uint64(0x9E3779B97F4A7C15)  # rank -> id: an odd multiplier modulo 2^56 (a bijection), so the ids of
ID_MASK = np.uint64((1 << TABLE_SHIFT) - 1)  # the top ranks are scattered, not 0, 1, 2, ...


@dataclass(frozen=True)
class Field:
    """One table's ids: Zipf(exponent) over num_ids ids (rank r is the r-th most frequent)."""

    name: str
    num_ids: int
    exponent: float

    def rank_probs(self, k: int) -> np.ndarray:
        """Probability of each of the first k ranks in one draw of harness.zipf_ids (its inverse CDF)."""
        a = 1.0 - self.exponent
        r = np.arange(min(k, self.num_ids) + 1, dtype=np.float64) + 1.0
        cdf = np.minimum((r**a - 1.0) / (float(self.num_ids) ** a - 1.0), 1.0)  # its last rank is never drawn
        return np.diff(cdf)


FIELDS = (
    Field("zipf_10m", 10_000_000, 1.1),
    Field("zipf_1m", 1_000_000, 1.1),
    Field("zipf_100k", 100_000, 1.1),
    Field("steep_300k", 300_000, 1.3),
    Field("flat_50m", 50_000_000, 0.3),  # near-uniform, high-cardinality: ids mostly seen once
    Field("hot_12k", 12_000, 0.8),  # small and hot: its working set is most of its ids
)


def perfect_cuts(fields: tuple[Field, ...], ram_rows: int) -> np.ndarray:
    """For each field, how many of its top ranks a static cache of the ram_rows most probable ids holds."""
    probs = [f.rank_probs(ram_rows) for f in fields]
    owner = np.concatenate([np.full(len(p), t) for t, p in enumerate(probs)])
    top = np.argsort(np.concatenate(probs), kind="stable")[::-1][:ram_rows]
    return np.bincount(owner[top], minlength=len(fields))


def arena(width: int, budget: MemoryBudget) -> Arena:
    """An arena whose dirty rows, when another table takes them back, are persisted as the Table's are (here only
    marked clean and stored: nothing is written)."""
    a = Arena(width, budget)

    def persist(rows: np.ndarray) -> None:
        a.dirty[rows] = 0
        a.stored[rows] = 1

    a.persist = persist
    return a


def misses_by_table(a: Arena, ids: np.ndarray, table_of: np.ndarray, k: int) -> np.ndarray:
    """Per table, how many of ids the arena does not hold (reads the index only: nothing is touched)."""
    rows, _ = a.find_rows(ids)
    return np.bincount(table_of[rows < 0], minlength=k)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ram-rows", type=int, default=48_000, help="rows the shared RAM tier holds")
    ap.add_argument("--draws", type=int, default=4096, help="examples per request: draws per table")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    fields, k = FIELDS, len(FIELDS)
    layout = layout_of(DIM, OPTIMIZER)
    charge = Arena(layout.width, MemoryBudget(1 << 20)).row_charge
    shared = MemoryBudget(args.ram_rows * charge)
    split = [arena(layout.width, shared) for _ in fields]
    one = arena(layout.width, MemoryBudget(args.ram_rows * charge))
    rng = np.random.default_rng(args.seed)
    cuts = perfect_cuts(fields, args.ram_rows)
    width = args.draws * k
    out = np.empty((width, DIM), np.float32)
    push_rows = np.zeros((width, layout.width), np.float32)
    missed = {name: [] for name in ("split", "one", "perfect")}
    unique = []
    reread = {"split": [], "one": []}  # ids a push found missing (read again), per request
    for q in range(args.requests):
        ranks = [np.unique(harness.zipf_ids(rng, args.draws, f.num_ids, f.exponent)) for f in fields]
        ids = [np.sort(r * SCATTER & ID_MASK) for r in ranks]
        tagged = np.concatenate([i | np.uint64(t << TABLE_SHIFT) for t, i in enumerate(ids)])  # sorted: t ascends
        table_of = np.repeat(np.arange(k), [len(i) for i in ids])
        if q >= args.warmup:
            missed["split"].append([a.find_rows(i)[1] for a, i in zip(split, ids)])
            missed["one"].append(misses_by_table(one, tagged, table_of, k))
            missed["perfect"].append([int(np.count_nonzero(r >= c)) for r, c in zip(ranks, cuts)])
            unique.append([len(i) for i in ids])
        for a, i in zip(split, ids):
            pull(a, i, out, push_rows)
        again = [push(a, i, push_rows) for a, i in zip(split, ids)]  # rows another table took back in between
        pull(one, tagged, out, push_rows)
        again_one = push(one, tagged, push_rows)
        if q >= args.warmup:
            reread["split"].append(sum(again))
            reread["one"].append(again_one)

    per_table = {name: np.mean(np.asarray(v, dtype=np.float64), axis=0) for name, v in missed.items()}
    total = {name: float(v.sum()) for name, v in per_table.items()}
    ids_per_table = np.mean(np.asarray(unique, dtype=np.float64), axis=0)
    share = args.ram_rows // k
    held = [a.used for a in split]
    held_one = np.bincount((one.ids[: one.used] >> np.uint64(TABLE_SHIFT)).astype(np.int64), minlength=k)
    print(f"{args.requests - args.warmup} requests after {args.warmup}: {args.draws:,} draws per table each "
          f"({ids_per_table.sum():,.0f} unique ids over {k} tables), RAM tier {args.ram_rows:,} rows "
          f"(fair share {share:,})")  # fmt: skip
    print(f"{'table':12s} {'ids/req':>8s} | misses per request: {'split':>8s} {'one table':>10s} {'perfect':>8s} | "
          f"rows held: {'split':>7s} {'one table':>10s} {'perfect':>8s}")  # fmt: skip
    for t, f in enumerate(fields):
        print(f"{f.name:12s} {ids_per_table[t]:8,.0f} | {'':20s}{per_table['split'][t]:8,.0f} "
              f"{per_table['one'][t]:10,.0f} {per_table['perfect'][t]:8,.0f} | {'':11s}{held[t]:7,d} "
              f"{held_one[t]:10,d} {cuts[t]:8,d}")  # fmt: skip
    print(f"{'total':12s} {ids_per_table.sum():8,.0f} | {'':20s}{total['split']:8,.0f} {total['one']:10,.0f} "
          f"{total['perfect']:8,.0f}")  # fmt: skip
    more = total["split"] / total["one"] - 1
    again = {name: statistics.fmean(v) for name, v in reread.items()}
    print(f"split vs one table: {more:+.1%} misses; ids a push found missing (read again) per request: split "
          f"{again['split']:,.1f}, one table {again['one']:,.1f}")  # fmt: skip
    harness.emit({
        "ram_tier_rows": args.ram_rows,
        "draws_per_table": args.draws,
        "requests": len(unique),
        "tables": [f.name for f in fields],
        "unique_ids_per_request": ids_per_table.tolist(),
        "misses_per_request": total["split"],
        "one_table_misses_per_request": total["one"],
        "perfect_misses_per_request": total["perfect"],
        "split_over_one_table": more,
        "push_misses_per_request": again,
        "misses_by_table": {name: v.tolist() for name, v in per_table.items()},
        "rows_held": {"split": held, "one": held_one.tolist(), "perfect": cuts.tolist()},
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
