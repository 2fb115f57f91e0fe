"""A shard under every kind of request at once, against an oracle: pushes (single and batched, exactly-once with
retries) and pulls on several tables, CreateTable of new tables, Shrink, checkpoints (hold, save, release),
clock advances, Stats, and a scratch table pulled while it is replaced by one of another spec again and again;
the flusher runs every 10 ms over a RAM tier of 8 rows per table (every request evicts, tables take rows back
from each other), the write-behind's bound is a few rows, and requests wait for request room. Then the process
is killed (tests.conftest.crash) and the data dir opened again. About 7 s; STRESS_SEED and STRESS_S (seconds of
load) vary it.

The oracle: every table is SGD with learning rate 1 over zero initial rows and gradients of small integers, so
an id's embedding is minus the sum of the gradients applied to it, exactly, in any order. Each id belongs to one
pusher thread, which sends one request at a time: the id's value is always one of the prefix sums of its
pushes. Checked:
- a pull returns, for each id, a prefix sum between the pushes acknowledged before it began and those sent
  before it ended;
- a checkpoint holds each id at its acknowledged pushes, plus the request in flight during the hold either whole
  or not at all (no torn cut);
- after the kill and restart, every acknowledged push is there, once (retries of acknowledged requests apply
  nothing);
- no request fails but a push refused by a hold (UNAVAILABLE, retried), and a hold refused while a Shrink runs or a
  Shrink while a checkpoint holds or saves (FAILED_PRECONDITION, nothing applied), and so nothing would reach a
  client as INTERNAL;
- Stats' counters never go down, and the RAM tier's count of its bytes is its tables' rows at the end;
- no thread hangs: a join past its deadline fails with every thread's stack.
"""

from __future__ import annotations

import faulthandler
import io
import os
import random
import threading
import time

import numpy as np
import pytest

import ps.engine.shard as shard_module
from ps.checkpoint import FORMAT, write_manifest
from ps.config import EvictionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.push import TablePush
from ps.engine.room import RequestRoom, push_cost
from ps.engine.shard import Shard
from ps.errors import CheckpointHoldError, CheckpointInProgressError, PsError, ShardClosingError
from ps.rows.layout import layout_of
from ps.server_config import ServerConfig
from ps.sharding import NUM_SLOTS
from ps.storage import budget as budget_module
from tests.conftest import crash

SEED = int(os.environ.get("STRESS_SEED", "20240611"))
RUN_S = float(os.environ.get("STRESS_S", "6"))
DIM = 4
PUSHERS = 4
PULLERS = 2
IDS_PER_TABLE = 240  # per table, split over the pushers (id % PUSHERS)
FIRST_TABLES = 3
LATE_TABLES = 3  # created while the load runs
SHARE_ROWS = 8  # each table's fair share with every table there: requests of more ids go in chunks
SCRATCH = "scratch"  # a table pulled, never pushed, and replaced by one of another spec all the time
COUNTERS = ("pulls", "pushes", "ids_pulled", "ids_pushed", "cache_misses", "admitted", "evictions", "dropped")
JOIN_S = 60.0


def spec(i: int) -> TableConfig:
    """Table i: dim 4, SGD lr 1 over zero rows (value = -sum of grads); Shrink decays its statistics, which
    rewrites every row it scans, and drops nothing."""
    return TableConfig(f"t{i}", DIM, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0),
                       eviction=EvictionConfig(decay=0.5))  # fmt: skip


@pytest.fixture(autouse=True)
def small_shares(monkeypatch):
    monkeypatch.setattr(budget_module, "MIN_SHARE_ROWS", 4)


class Oracle:
    """Per (table, id): the prefix sums of the gradients sent to it (sums[0] is 0), and how many of those pushes
    were acknowledged. Only the id's owner thread appends; readers take lengths, which only grow."""

    def __init__(self) -> None:
        self.sums: dict[tuple[str, int], list[np.ndarray]] = {}
        self.acked: dict[tuple[str, int], int] = {}
        self.inflight: dict[int, list[tuple[str, int]]] = {}  # pusher -> the keys of its request in flight

    def sent(self, key: tuple[str, int], grad: np.ndarray) -> None:
        sums = self.sums.setdefault(key, [np.zeros(DIM)])
        self.acked.setdefault(key, 0)
        sums.append(sums[-1] + grad)

    def allowed(self, key: tuple[str, int], lo: int, hi: int) -> list[np.ndarray]:
        sums = self.sums.get(key, [np.zeros(DIM)])
        return [-s for s in sums[lo : hi + 1]]


class Load:
    def __init__(self, shard: Shard, root: str) -> None:
        self.shard = shard
        self.root = root
        self.oracle = Oracle()
        self.tables = [spec(i).name for i in range(FIRST_TABLES)]
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.checkpoints: list[tuple[str, dict, dict, list]] = []  # (dir, acked, sent counts, in flight)
        self.counts = {
            "pushes": 0,
            "refused": 0,
            "pulls": 0,
            "checkpoints": 0,
            "shrinks": 0,
            "stats": 0,
            "replaced": 0,
            "refused_holds": 0,
            "refused_shrinks": 0,
        }

    def fail(self, what: str) -> None:
        self.failures.append(what)
        self.stop.set()

    def guarded(self, name: str, body) -> threading.Thread:
        def run() -> None:
            try:
                body()
            except PsError as e:
                self.fail(f"{name}: {type(e).__name__} ({e.status}): {e}")
            except BaseException as e:  # would reach a client as INTERNAL
                self.fail(f"{name}: {type(e).__name__}: {e}")

        return threading.Thread(target=run, name=name, daemon=True)

    # ---- the threads ----------------------------------------------------------------------------------
    def pusher(self, me: int) -> None:
        rng = random.Random(SEED + me)
        client, seq = 1000 + me, 0
        while not self.stop.is_set():
            names = rng.sample(self.tables, min(len(self.tables), rng.choice((1, 1, 2))))
            pushes, keys = [], []
            for name in names:
                n = rng.choice((1, 3, 8, 20, 60))  # 60: more than a chunk (half a share)
                ids = sorted(rng.sample(range(me, IDS_PER_TABLE, PUSHERS), min(n, IDS_PER_TABLE // PUSHERS)))
                grads = np.array([[rng.choice((-2, -1, 1, 2)) for _ in range(DIM)] for _ in ids], np.float32)
                for i, g in zip(ids, grads):
                    self.oracle.sent((name, i), g.astype(np.float64))
                    keys.append((name, i))
                pushes.append(TablePush(name, np.array(ids, np.uint64), grads, None, None, False))
            seq += 1
            self.oracle.inflight[me] = keys
            advance = rng.choice((0, 0, 1))
            while True:
                try:
                    self.shard.push_batch(pushes, advance, client, seq)
                    break
                except CheckpointInProgressError:
                    self.counts["refused"] += 1
                    time.sleep(0.002)
            for key in keys:
                self.oracle.acked[key] += 1
            self.oracle.inflight[me] = []
            self.counts["pushes"] += 1
            if rng.random() < 0.1:  # a retry of an acknowledged request (the same request): applies nothing
                while True:
                    try:
                        _, applied = self.shard.push_batch(pushes, advance, client, seq)
                        break
                    except CheckpointInProgressError:
                        time.sleep(0.002)
                if applied:
                    self.fail(f"pusher {me}: a retry of acknowledged request {seq} applied {applied} pushes")

    def puller(self, me: int) -> None:
        rng = random.Random(SEED + 100 + me)
        while not self.stop.is_set():
            names = rng.sample(self.tables, rng.choice((1, 2)))
            pulls = [(n, sorted(rng.sample(range(IDS_PER_TABLE), rng.choice((1, 5, 30, 80))))) for n in names]
            keys = [(n, i) for n, ids in pulls for i in ids]
            lo = [self.oracle.acked.get(k, 0) for k in keys]
            pulls = [(n, np.array(ids, np.uint64)) for n, ids in pulls]
            if len(pulls) == 1:
                got = [self.shard.pull(*pulls[0])]
            else:
                pulls = [(self.shard.table(n), ids) for n, ids in pulls]
                got = self.shard.pulls.pull_batch(pulls, self.shard.pulls.check_pull_batch(pulls), lambda rows: rows)
            rows = np.concatenate(got)
            hi = [len(self.oracle.sums.get(k, [0])) - 1 for k in keys]
            for k, row, a, b in zip(keys, rows, lo, hi):
                if not any(np.array_equal(row, want) for want in self.oracle.allowed(k, a, b)):
                    self.fail(f"pull of {k}: {row.tolist()} is no sum of its pushes {a}..{b}: "
                              f"{[w.tolist() for w in self.oracle.allowed(k, 0, b)]}")  # fmt: skip
            self.counts["pulls"] += 1

    def creator(self) -> None:
        rng = random.Random(SEED + 200)
        for i in range(FIRST_TABLES, FIRST_TABLES + LATE_TABLES):
            if self.stop.wait(RUN_S / (LATE_TABLES + 1)):
                return
            self.shard.check_create(spec(i))
            self.shard.create_table(spec(i))
            self.tables.append(spec(i).name)
            self.shard.create_table(spec(rng.randrange(i + 1)))  # one that exists: returned as it is

    def replacer(self) -> None:
        """The scratch table, pulled and never pushed, replaced by one of another dim again and again."""
        dims = (2, 3)
        k = 0
        while not self.stop.wait(0.05):
            k += 1
            self.shard.create_table(TableConfig(SCRATCH, dims[k % 2]), replace_untrained=True)
            self.counts["replaced"] += 1

    def scratch_puller(self) -> None:
        rng = random.Random(SEED + 500)
        while not self.stop.is_set():
            ids = np.array(sorted(rng.sample(range(IDS_PER_TABLE), rng.choice((1, 30, 80)))), np.uint64)
            try:
                rows = self.shard.pull(SCRATCH, ids)
            except ShardClosingError:  # replaced as it ran: UNAVAILABLE, the client retries
                continue
            if rows.shape[1] not in (2, 3) or not np.isfinite(rows).all():
                self.fail(f"scratch pull: rows of shape {rows.shape}")

    def shrinker(self) -> None:
        rng = random.Random(SEED + 300)
        while not self.stop.wait(rng.uniform(0.1, 0.4)):
            try:
                self.shard.shrink(rng.choice(["", *self.tables]))
            except CheckpointHoldError as e:  # a checkpoint holds the shard or saves: refused, nothing applied
                if "a Shrink run meanwhile would be saved in part" not in str(e):
                    raise
                self.counts["refused_shrinks"] += 1
                continue
            self.counts["shrinks"] += 1

    def checkpointer(self) -> None:
        rng = random.Random(SEED + 400)
        while not self.stop.wait(rng.uniform(0.2, 0.6)):
            try:
                clock, token = self.shard.hold(60)
            except CheckpointHoldError as e:  # a Shrink runs: no hold meanwhile (ps.engine.hold shrink_slot)
                if "a Shrink is running" not in str(e):
                    raise
                self.counts["refused_holds"] += 1
                continue
            try:  # every push in flight has ended: what was sent and acknowledged now brackets what it holds
                acked = dict(self.oracle.acked)
                sent = {k: len(v) - 1 for k, v in self.oracle.sums.items()}
                inflight = [list(keys) for keys in self.oracle.inflight.values() if keys]
                path = os.path.join(self.root, f"ckpt-{len(self.checkpoints)}")
                info = self.shard.save_checkpoint(path, token)
            finally:
                self.shard.release(token)
            # the tables the save holds (a table created since is not in it), as worker.checkpoint names them
            tables = [self.shard.table(name).cfg.to_dict() for name in info["rows"]]
            write_manifest(path, {"format": FORMAT, "num_shards": 1, "num_slots": NUM_SLOTS, "clock": clock,
                                  "created": "now", "tables": tables, "shards": [info]})  # fmt: skip
            self.checkpoints.append((path, acked, sent, inflight))
            self.counts["checkpoints"] += 1

    def clock(self) -> None:
        while not self.stop.wait(0.05):
            self.shard.advance_clock(1)

    def stats(self) -> None:
        seen: dict[str, dict] = {}
        while not self.stop.wait(0.01):
            s = self.shard.stats()
            for t in s["tables"]:
                before = seen.get(t["name"])
                if before is not None:
                    down = [c for c in COUNTERS if t[c] < before[c]]
                    if down:
                        self.fail(f"Stats of table {t['name']}: {down} went down: {before} then {t}")
                seen[t["name"]] = t
            if s["flush_failures"]:
                self.fail(f"Stats: {s['flush_failures']} background flushes failed")
            self.counts["stats"] += 1

    def everything_ran(self) -> bool:
        """Every table created and every kind of operation done at least once; a push refused by a checkpoint's
        hold ("refused"), a hold refused by a Shrink ("refused_holds") or a Shrink by a hold ("refused_shrinks") needs
        a coincidence of timing and is not waited for."""
        done = all(n for kind, n in self.counts.items() if kind not in ("refused", "refused_holds", "refused_shrinks"))
        return done and len(self.tables) == FIRST_TABLES + LATE_TABLES

    def run(self) -> None:
        threads = [self.guarded(f"pusher-{i}", lambda i=i: self.pusher(i)) for i in range(PUSHERS)]
        threads += [self.guarded(f"puller-{i}", lambda i=i: self.puller(i)) for i in range(PULLERS)]
        threads += [self.guarded(n, getattr(self, n)) for n in ("creator", "shrinker", "checkpointer", "clock",
                                                                  "stats", "replacer", "scratch_puller")]  # fmt: skip
        for t in threads:
            t.start()
        self.stop.wait(RUN_S)
        longest = time.monotonic() + 20 * RUN_S  # a loaded machine: on until every kind of operation ran
        while not self.stop.is_set() and not self.everything_ran() and time.monotonic() < longest:
            self.stop.wait(0.1)
        self.stop.set()
        deadline = time.monotonic() + JOIN_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        hung = [t.name for t in threads if t.is_alive()]
        if hung:
            stacks = io.StringIO()
            with open(os.path.join(self.root, "stacks.txt"), "w+") as f:
                faulthandler.dump_traceback(f, all_threads=True)
                f.seek(0)
                stacks.write(f.read())
            raise AssertionError(f"threads still running {JOIN_S:g} s after the stop: {hung}\n{stacks.getvalue()}")


def check_rows(shard: Shard, want: dict[tuple[str, int], list[np.ndarray]], what: str) -> None:
    """Every key's row in shard is one of want[key] (the keys of tables the shard holds)."""
    by_table: dict[str, list[int]] = {}
    for name, i in want:
        by_table.setdefault(name, []).append(i)
    for name, ids in by_table.items():
        rows = shard.pull(name, np.array(ids, np.uint64))
        for i, row in zip(ids, rows):
            if not any(np.array_equal(row, w) for w in want[(name, i)]):
                raise AssertionError(f"{what}: ({name}, {i}) holds {row.tolist()}, expected one of "
                                     f"{[w.tolist() for w in want[(name, i)]]}")  # fmt: skip


def test_control_operations_race_data_operations(tmp_path, monkeypatch):
    row = layout_of(DIM, "sgd").ram_bytes
    cache = (FIRST_TABLES + LATE_TABLES + 1) * SHARE_ROWS * row
    config = ServerConfig(data_dir=str(tmp_path / "data"), cache_bytes=cache, flush_interval_s=0.01,
                          checkpoint_root=str(tmp_path))  # fmt: skip
    room = RequestRoom(3 * push_cost(120, layout_of(DIM, "sgd").width))
    with monkeypatch.context() as small:  # the shard's one room, made so: its pulls and pushes (PushPath's) wait
        small.setattr(shard_module, "RequestRoom", lambda *args: room)
        shard = Shard(config)
    assert shard.room is room and shard.pushes._room is room
    shard.store._behind.max_pending_bytes = 4 * row  # the write-behind's bound: a few rows, callers wait on it
    for i in range(FIRST_TABLES):
        shard.create_table(spec(i))
    shard.create_table(TableConfig(SCRATCH, 2))
    load = Load(shard, str(tmp_path))
    try:
        load.run()
        assert not load.failures, "\n".join(load.failures[:5])
        assert load.everything_ran(), load.counts
        assert len(shard.tables) == FIRST_TABLES + LATE_TABLES + 1
        arenas = [t.arena for t in shard.tables.values()]
        assert sorted(map(id, shard.budget._members)) == sorted(map(id, arenas))
        assert shard.budget.used_bytes == sum(a.ram_bytes() for a in arenas), "the RAM tier's count of its bytes"
        oracle = load.oracle
        assert oracle.acked == {k: len(v) - 1 for k, v in oracle.sums.items()}  # nothing left in flight
    except BaseException:
        shard.close()
        raise
    crash(shard)  # kill -9: dirty rows and most of the write-behind's are lost; the journal has them
    shard = Shard(config)
    try:
        check_rows(shard, {k: [-v[oracle.acked[k]]] for k, v in oracle.sums.items()}, "after the restart")
    finally:
        shard.close()

    for path, acked, sent, inflight in load.checkpoints[:2]:
        restored = Shard(ServerConfig(data_dir=path + "-restored", restore_dir=path, cache_bytes=cache))
        try:
            want = {k: oracle.allowed(k, acked[k], sent[k]) for k in acked if k[0] in restored.tables}
            check_rows(restored, want, f"checkpoint {path}")
            for keys in inflight:  # a request in flight during the hold is in the checkpoint whole, or not at all
                keys = [k for k in keys if k[0] in restored.tables]
                got = [restored.pull(k[0], np.array([k[1]], np.uint64))[0] for k in keys]
                whole = [np.array_equal(g, -oracle.sums[k][acked[k] + 1]) for k, g in zip(keys, got)
                         if sent[k] > acked[k]]  # fmt: skip
                assert all(whole) or not any(whole), f"checkpoint {path} holds part of a request: {keys} {whole}"
        finally:
            restored.close()
