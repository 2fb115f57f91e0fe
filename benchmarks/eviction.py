"""The RAM tier's eviction under requests that do not repeat themselves: the hit rate of the Arena's policy next to
plain CLOCK and to a perfect cache, on the same request stream, and the cost of the hit path per id.

    python benchmarks/eviction.py [--rows 3000000] [--ram-share 30] [--draws 100000] [--requests 400] [--warmup 200]

Two arenas of a dim-16 Adagrad table, each with room for rows / ram-share rows, serve the same requests in turn:
one with the Arena's eviction (ps.storage.eviction: probation queue, ghost, CLOCK over use counts), one switched to
plain CLOCK (the arena's private `_plain_clock`: one referenced bit per row). Each request is the unique ids of
--draws draws from Zipf(1.1) over --rows ids, drawn fresh (harness.zipf_ids), through a fixed random permutation of
the ids; it is served as ps.engine.table.Table serves training: a pull (gather_hits; on a miss, pin_held of the
hits and a lookup of the ids that missed, then grow / victims / forget / install for those, their rows zeros:
nothing is read from disk here) and then a push
of the same ids (ps.rows.update.commit, the push's store step, which touches the rows; then Arena.pushed). The
hit rate of a request
is the fraction of its unique ids the pull finds in RAM, averaged over the requests after --warmup (the arenas
fill and settle first). The perfect cache holds the ids of the top ranks, as many as the arena holds: its hit rate
is the fraction of a request's unique ids whose rank is under that.
Pulled ahead: fresh arenas serve the same requests as a worker with a prefetch of one batch does, the pull of
request q + 1 before the push of request q, which admits the ids it finds missing (a server reads them again):
misses per pull and ids missing at the push, for the Arena's eviction, for it without the wait for a push
(eviction.RECENT_SHARE 0) and for plain CLOCK.
Hit path: gather_hits (the pull of ids all in RAM) and lookup (touch and pin) on the same ids of rows in RAM, the
Arena's kernels next to copies of the kernels as they were with one referenced bit (`ref = 1`), alternated
(harness.alternate); "settled" leaves each row's count as the previous call left it (a hot row's line is not
written), "swept" sets every count to 0 before each call (untimed), so every touch writes, as after the hand.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import harness  # before numpy: see its docstring
import numba
import numpy as np

from ps.accel.prefetch import AHEAD, prefetch_row
from ps.rows import update
from ps.rows.layout import layout_of
from ps.rows.parallel import parts, run_each, run_parts
from ps.rows.updateio import RowState
from ps.storage import eviction as eviction_module
from ps.storage.arena import Arena
from ps.storage.arenalookups import _group_by_home
from ps.storage.budget import MemoryBudget
from ps.storage.index import find, lookup_into, prefetch_slot

DIM = 16
OPTIMIZER = "adagrad"


# ---- the hit-path kernels with one referenced bit, as they were: the reference -------------------------------
@numba.njit(nogil=True, cache=True)
def _lookup_gather_bit(slots, shift, ids, data, cols, out, ref):
    n = ids.shape[0]
    rows = np.empty(n, np.int64)
    lookup_into(slots, shift, ids, rows)
    misses = 0
    for i in range(n):
        if i + AHEAD < n and rows[i + AHEAD] >= 0:
            prefetch_row(data, rows[i + AHEAD])
        r = rows[i]
        if r < 0:
            misses += 1
            continue
        if ref[r] == 0:
            ref[r] = 1
        for j in range(cols):
            out[i, j] = data[r, j]
    return misses


@numba.njit(nogil=True, cache=True)
def _lookup_touch_bit(slots, shift, ids, positions, out, ref, pin, stamp):
    dup = -1
    n = positions.shape[0]
    for p in range(n):
        if p + AHEAD < n:
            prefetch_slot(slots, shift, ids[positions[p + AHEAD]])
        i = positions[p]
        r = find(slots, shift, ids[i])
        out[i] = r
        if r >= 0:
            ref[r] = 1
            if pin[r] == stamp and dup < 0:
                dup = i
            pin[r] = stamp
    return dup


def gather_hits_bit(a: Arena, ids: np.ndarray, cols: int, out: np.ndarray) -> int:
    """Arena.gather_hits with the one-bit kernel."""
    slots, shift = a.index.slots, a.index.shift
    return sum(run_parts(
        lambda lo, hi: _lookup_gather_bit(slots, shift, ids[lo:hi], a.data, cols, out[lo:hi], a.ref), len(ids)
    ))  # fmt: skip


def lookup_bit(a: Arena, ids: np.ndarray, stamp: int) -> np.ndarray:
    """Arena.lookup with the one-bit kernel."""
    out = np.empty(len(ids), dtype=np.int64)
    slots, shift = a.index.slots, a.index.shift
    k = len(parts(len(ids)))
    if k == 1:
        positions, starts = np.arange(len(ids), dtype=np.int64), np.array([0, len(ids)])
    else:
        positions, starts = _group_by_home(ids, shift, k)
    run_each(
        lambda g: _lookup_touch_bit(slots, shift, ids, positions[starts[g] : starts[g + 1]], out, a.ref, a.pin, stamp),
        k,
    )
    return out


# ---- serving a request as the Table does ----------------------------------------------------------------------
def admit(a: Arena, missing: np.ndarray, stamp: int, push_rows: np.ndarray) -> np.ndarray:
    """Rows for missing ids (new ones first, then victims), installed with zero rows; returns them."""
    room = a.grow(len(missing), stamp)
    if len(room) < len(missing):
        victims = a.victims(len(missing) - len(room), stamp)
        if len(victims) < len(missing) - len(room):
            raise RuntimeError("no evictable rows: the RAM tier is too small for one request")
        a.forget(victims)
        room = np.concatenate([room, victims])
    m = len(missing)
    a.install(room, missing, push_rows[:m], np.zeros(m, np.uint64), np.zeros(m, np.uint8), stamp)
    return room


def pull(a: Arena, ids: np.ndarray, out: np.ndarray, push_rows: np.ndarray) -> int:
    """A pull of unique ids; returns how many it found in RAM."""
    n = len(ids)
    rows = np.empty(n, dtype=np.int64)
    misses = a.gather_hits(ids, DIM, out[:n], rows)
    if misses:
        stamp = a.new_stamp()
        a.pin_held(rows, ids, stamp)
        missed = ids[rows < 0]
        again, _ = a.lookup(missed, stamp)
        admit(a, missed[again < 0], stamp, push_rows)
    return n - misses


def push(a: Arena, ids: np.ndarray, push_rows: np.ndarray) -> int:
    """A push of unique ids (Table._rows_for_push admits ids missing from RAM first: read again, in a server);
    returns how many were missing."""
    rows, absent = a.find_rows(ids)
    if absent:
        stamp = a.new_stamp()
        rows, _ = a.lookup(ids, stamp)
        rows[rows < 0] = admit(a, ids[rows < 0], stamp, push_rows)
    update.commit(RowState(a.data, a.lsn, a.dirty, a.stored, a.ref), rows, push_rows[: len(ids)], 1)
    a.pushed(rows)
    return absent


def serve(a: Arena, ids: np.ndarray, out: np.ndarray, push_rows: np.ndarray) -> int:
    """Pull then push of unique ids; returns how many the pull found in RAM."""
    found = pull(a, ids, out, push_rows)
    if push(a, ids, push_rows):
        raise RuntimeError("a push found ids of its own pull missing")
    return found


def pulling_ahead(a: Arena, stream: list[np.ndarray], warmup: int, out: np.ndarray, push_rows: np.ndarray,
                  recent_share: float) -> tuple[float, float]:  # fmt: skip
    """Serves stream as a worker with a prefetch of one request does (the pull of request q + 1, then the push of
    request q), with eviction.RECENT_SHARE set to recent_share; (misses per pull, ids missing per push) averaged over
    the requests after warmup."""
    saved, eviction_module.RECENT_SHARE = eviction_module.RECENT_SHARE, recent_share
    try:
        pull(a, stream[0], out, push_rows)
        pulls, pushes = [], []
        for q in range(len(stream) - 1):
            found = pull(a, stream[q + 1], out, push_rows)
            missing = push(a, stream[q], push_rows)
            if q >= warmup:
                pulls.append(len(stream[q + 1]) - found)
                pushes.append(missing)
        return statistics.fmean(pulls), statistics.fmean(pushes)
    finally:
        eviction_module.RECENT_SHARE = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=3_000_000)
    ap.add_argument("--ram-share", type=int, default=30, help="the RAM tier holds rows / ram-share rows")
    ap.add_argument("--draws", type=int, default=100_000, help="Zipf draws per request (its unique ids are sent)")
    ap.add_argument("--exponent", type=float, default=1.1)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--reps", type=int, default=100, help="alternated calls per leg of the hit-path timing")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    layout = layout_of(DIM, OPTIMIZER)
    ram_rows = args.rows // args.ram_share
    charge = Arena(layout.width, MemoryBudget(1 << 20)).row_charge
    arenas = {"s3fifo": Arena(layout.width, MemoryBudget(ram_rows * charge)),
              "clock": Arena(layout.width, MemoryBudget(ram_rows * charge))}  # fmt: skip
    arenas["clock"]._plain_clock = True
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(args.rows).astype(np.uint64)
    out = np.empty((args.draws, DIM), np.float32)
    push_rows = np.zeros((args.draws, layout.width), np.float32)
    hit_rates = {name: [] for name in [*arenas, "perfect"]}
    unique, stream = [], []
    serve_s = dict.fromkeys(arenas, 0.0)
    t0 = time.perf_counter()
    for q in range(args.requests):
        ranks = np.unique(harness.zipf_ids(rng, args.draws, args.rows, args.exponent))
        ids = np.sort(perm[ranks])  # the client sends its unique ids sorted
        stream.append(ids)
        for name, a in arenas.items():
            t = time.perf_counter()
            found = serve(a, ids, out, push_rows)
            if q >= args.warmup:
                serve_s[name] += time.perf_counter() - t
                hit_rates[name].append(found / len(ids))
        if q >= args.warmup:
            hit_rates["perfect"].append(float(np.mean(ranks < ram_rows)))
            unique.append(len(ids))
    stream_s = time.perf_counter() - t0
    ahead = {}  # the same requests, pulled ahead of their push
    for name, plain, share in (("wait", False, eviction_module.RECENT_SHARE), ("no wait", False, 0.0),
                               ("clock", True, 0.0)):  # fmt: skip
        fresh = Arena(layout.width, MemoryBudget(ram_rows * charge))
        fresh._plain_clock = plain
        ahead[name] = pulling_ahead(fresh, stream, args.warmup, out, push_rows, share)
    rate = {name: statistics.fmean(v) for name, v in hit_rates.items()}
    ids_per_request = statistics.fmean(unique)

    # the hit path: ids of rows in RAM, sorted, about as many as a request's hits
    a = arenas["s3fifo"]
    resident = a.ids[np.setdiff1d(np.arange(a.used), a.free)]
    hits = np.sort(rng.choice(resident, size=min(len(resident), int(ids_per_request)), replace=False))
    n = len(hits)
    out_hits = np.empty((n, DIM), np.float32)

    def swept() -> None:
        a.ref[: a.used] = 0

    legs = []
    for variant, prepare in (("settled", lambda: None), ("swept", swept)):
        legs += [
            harness.Leg(f"gather bit {variant}", lambda _: gather_hits_bit(a, hits, DIM, out_hits), prepare),
            harness.Leg(f"gather count {variant}", lambda _: a.gather_hits(hits, DIM, out_hits), prepare),
            harness.Leg(f"lookup bit {variant}", lambda _: lookup_bit(a, hits, a.new_stamp()), prepare),
            harness.Leg(f"lookup count {variant}", lambda _: a.lookup(hits, a.new_stamp()), prepare),
        ]
    harness.alternate(legs, args.reps)
    ns_per_id = {leg.name: 1e9 * statistics.median(leg.seconds) / n for leg in legs}

    print(f"{args.requests - args.warmup} requests after {args.warmup} untimed: {ids_per_request:,.0f} unique ids each "
          f"(of {args.draws:,} Zipf({args.exponent}) draws over {args.rows:,} ids), RAM tier {ram_rows:,} rows "
          f"(1/{args.ram_share}); stream {stream_s:.0f} s")  # fmt: skip
    for name, label in (("clock", "plain CLOCK"), ("s3fifo", "Arena's eviction"), ("perfect", "perfect cache")):
        r = rate[name]
        print(f"{label:18s} hit rate {r:.3f}  misses per request {(1 - r) * ids_per_request:,.0f}")
    fewer = 1 - (1 - rate["s3fifo"]) / (1 - rate["clock"])
    closed = (rate["s3fifo"] - rate["clock"]) / (rate["perfect"] - rate["clock"])
    print(f"misses: {fewer:.1%} fewer than plain CLOCK; {closed:.0%} of CLOCK's gap to the perfect cache closed")
    print(f"pulled ahead (a worker's prefetch: the pull of request q + 1, then the push of request q), misses per "
          f"pull + ids missing at the push (read again): Arena's eviction {ahead['wait'][0]:,.0f} + "
          f"{ahead['wait'][1]:,.0f}; without the wait for a push {ahead['no wait'][0]:,.0f} + "
          f"{ahead['no wait'][1]:,.0f}; plain CLOCK {ahead['clock'][0]:,.0f} + {ahead['clock'][1]:,.0f}")  # fmt: skip
    ms = {name: 1e3 * v / len(unique) for name, v in serve_s.items()}
    print(f"serving a request in RAM (no disk; misses installed as zeros): Arena's eviction {ms['s3fifo']:.1f} ms, "
          f"plain CLOCK {ms['clock']:.1f} ms")  # fmt: skip
    print(f"hit path, ns per id ({n:,} ids all in RAM, {len(legs[0].seconds)} alternated calls each, median):")
    for variant in ("settled", "swept"):
        for op in ("gather", "lookup"):
            bit, count = ns_per_id[f"{op} bit {variant}"], ns_per_id[f"{op} count {variant}"]
            print(f"  {op} {variant:8s} one bit {bit:6.1f}  use count {count:6.1f}  ({count / bit:.2f}x)")
    harness.emit({
        "table_rows": args.rows,
        "ram_tier_rows": ram_rows,
        "ids_per_request": round(ids_per_request),
        "requests": len(unique),
        "hit_rate": rate["s3fifo"],
        "clock_hit_rate": rate["clock"],
        "perfect_hit_rate": rate["perfect"],
        "fewer_misses_than_clock": fewer,
        "gap_closed": closed,
        "pulled_ahead_misses_per_request": {name: {"pull": p, "push": q} for name, (p, q) in ahead.items()},
        "serve_ms_per_request": ms["s3fifo"],
        "clock_serve_ms_per_request": ms["clock"],
        "hit_path_ns_per_id": {name.replace(" ", "_"): v for name, v in ns_per_id.items()},
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
