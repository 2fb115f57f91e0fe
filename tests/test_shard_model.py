"""A shard of several tables against a dict model under random operations: PushBatches with exactly-once
bookkeeping (retries, older requests, bad batches, a crash between two pushes of a request), clock advances,
Shrink by TTL, explicit and background flushes, clean restarts, crashes (inside a flush too), a late table, and
checkpoints restored into a fresh data dir; the tables share a RAM tier of a few rows, so they evict all the time
and take rows from each other. Every full row (embedding, optimizer state, statistics) and Stats' counts are
checked against the model; the optimizers' steps are written out here in numpy."""

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ps.config import (
    MAX_CLOCK,
    MAX_SEQ_JUMP,
    REQUEST_RETENTION_S,
    EvictionConfig,
    InitializerConfig,
    OptimizerConfig,
    TableConfig,
)
from ps.engine.push import TablePush, ids_applied
from ps.engine.shard import Shard
from ps.errors import InvalidArgumentError, TableNotFoundError
from ps.rows.initializers import init_rows
from ps.rows.layout import ADMITTED, CLICK, LAST_STEP, SHOW, STATS_FLOATS, layout_of
from ps.server_config import ServerConfig
from ps.storage import applied as applied_module
from ps.storage import budget as budget_module
from tests.conftest import FLUSH_CRASH_POINTS, crash, one_shard_checkpoint

TTL = 2
ACC0, EPS = 0.25, 1e-7  # adagrad's initial accumulator and epsilon
TABLES = [
    TableConfig("a", 3, InitializerConfig("uniform", 0.5, seed=9), OptimizerConfig("sgd", 1.0),
                eviction=EvictionConfig(ttl_steps=TTL)),
    TableConfig("g", 2, InitializerConfig("normal", 0.1, seed=4),
                OptimizerConfig("adagrad", 0.5, {"initial_accumulator": ACC0, "epsilon": EPS})),
    TableConfig("w", 6, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 0.5)),
]  # fmt: skip
LATE = TableConfig("late", 4, InitializerConfig("uniform", 0.25, seed=2), OptimizerConfig("sgd", 0.25))
ALL = {t.name: t for t in [*TABLES, LATE]}
POOL = [0, 1, 2, 255, 256, 2**32, 2**63, 2**64 - 1, *range(1000, 1016)]
CLIENTS = [7, 2**63 + 5]  # exactly-once clients; client 0 sends requests without exactly-once bookkeeping
WIDEST = max(layout_of(t.dim, t.optimizer.name).ram_bytes for t in ALL.values())
RAM_TIER = 12 * WIDEST  # 3 to 4 rows of the widest table per table's share: every request evicts


@pytest.fixture(autouse=True)
def tiny_shares(monkeypatch):
    """A RAM tier of a few rows holds the tables: a share may be one row here (MIN_SHARE_ROWS rows otherwise)."""
    monkeypatch.setattr(budget_module, "MIN_SHARE_ROWS", 1)


def initial_row(cfg: TableConfig, i: int) -> np.ndarray:
    """A row never pushed: the initial embedding, the optimizer's initial state, zero statistics."""
    row = np.zeros(layout_of(cfg.dim, cfg.optimizer.name).width, np.float32)
    init_rows(cfg.initializer, np.array([i], np.uint64), row[None, :], cfg.dim)
    if cfg.optimizer.name == "adagrad":
        row[cfg.dim : 2 * cfg.dim] = ACC0
    return row


def stepped(cfg: TableConfig, row: np.ndarray, g: np.ndarray, show: float, click: float, clock: int,
            add_delta: bool) -> np.ndarray:  # fmt: skip
    """row after one push of gradient g at clock: the optimizer's step (add_delta: g added to the embedding, the
    optimizer state as it was), then the statistics."""
    out, d, lr = row.copy(), cfg.dim, np.float32(cfg.optimizer.learning_rate)
    if add_delta:
        out[:d] += g
    elif cfg.optimizer.name == "sgd":
        out[:d] -= lr * g
    else:  # adagrad: a += g^2; w -= lr g / (sqrt(a) + eps)
        acc = out[d : 2 * d] + g * g
        out[d : 2 * d] = acc
        out[:d] -= lr * g / (np.sqrt(acc) + np.float32(EPS))
    sc = len(out) - STATS_FLOATS
    out[sc + SHOW] += show
    out[sc + CLICK] += click
    out[sc + LAST_STEP] = clock
    out[sc + ADMITTED] = 1
    return out


def assert_rows(cfg: TableConfig, got: np.ndarray, want: np.ndarray) -> None:
    """Exact for sgd (lr a power of two, integer grads); adagrad's division may round differently when compiled."""
    if cfg.optimizer.name == "sgd":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@st.composite
def pushes(draw, tables=("a", "g", "w"), min_size=1, max_size=3, nonempty=False):
    """TablePushes of unique ids from POOL, integer grads (one in five added as deltas), and shows (1..3) and clicks
    (<= shows) or the defaults."""
    out = []
    for _ in range(draw(st.integers(min_size, max_size))):
        name = draw(st.sampled_from(tables))
        dim = ALL[name].dim
        ids = draw(st.lists(st.sampled_from(POOL), unique=True, min_size=int(nonempty), max_size=9))
        n = len(ids)
        grads = np.array(draw(st.lists(st.integers(-3, 3), min_size=n * dim, max_size=n * dim)), np.float32)
        shows = clicks = None
        if draw(st.booleans()):
            shows = np.array(draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)), np.float32)
            clicks = np.array([draw(st.integers(0, int(s))) for s in shows], np.float32)
        add_delta = draw(st.integers(0, 4)) == 0
        out.append(TablePush(name, np.array(ids, np.uint64), grads.reshape(n, dim), shows, clicks, add_delta))
    return out


BAD_KINDS = ["repeated id", "non-finite grad", "grads of another shape", "no such table", "negative show"]


def spoiled(push: TablePush, kind: str) -> TablePush:
    """push made bad in one way; each is refused before anything is applied."""
    ids, grads = push.ids, push.grads
    if kind == "repeated id":
        ids = np.array([7, 8, 7], np.uint64)
        return TablePush(push.name, ids, np.ones((3, ALL[push.name].dim), np.float32))
    if kind == "non-finite grad":
        grads = np.ones((max(1, len(ids)), grads.shape[1]), np.float32)
        grads[-1, -1] = np.nan
        return TablePush(push.name, ids if len(ids) else np.array([5], np.uint64), grads)
    if kind == "grads of another shape":
        return TablePush(push.name, ids, np.ones((len(ids), grads.shape[1] + 1), np.float32))
    if kind == "no such table":
        return push._replace(name="nope")
    shows = np.ones(len(ids) or 1, np.float32)
    shows[-1] = -1.0
    ids = ids if len(ids) else np.array([5], np.uint64)
    return TablePush(push.name, ids, np.ones((len(ids), grads.shape[1]), np.float32), shows, np.zeros_like(shows))


class ShardModel(RuleBasedStateMachine):
    """The model: per table a dict id -> full row (a missing id reads as its initial row), the clock, each
    exactly-once client's requests acknowledged (newest last), and the tables' counters since the shard opened."""

    def __init__(self):
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="shard-sm-")
        self.dirs = 0
        self.rows: dict[str, dict[int, np.ndarray]] = {t.name: {} for t in TABLES}
        self.clock = 0
        self.sent: dict[int, list[tuple[int, list[TablePush], int]]] = {c: [] for c in CLIENTS}  # seq, batch, advance
        self.now = 1.8e9  # the exactly-once table's wall clock
        self.wall = mock.patch.object(applied_module, "wall_time", lambda: self.now)
        self.wall.start()

    def new_dir(self) -> str:
        self.dirs += 1
        return os.path.join(self.root, f"data-{self.dirs}")

    @initialize(interval=st.sampled_from([0.01, 0.05, 3600]))
    def start(self, interval):
        self.interval = interval  # a short interval: the flusher runs between (and during) the steps
        self.dir = self.new_dir()
        self.open()
        for cfg in TABLES:
            self.shard.create_table(cfg)

    def open(self, restore: str | None = None) -> None:
        self.shard = Shard(ServerConfig(data_dir=self.dir, cache_bytes=RAM_TIER, flush_interval_s=self.interval,
                                        restore_dir=restore))  # fmt: skip
        self.counters = {name: dict.fromkeys(("pulls", "ids_pulled", "pushes", "ids_pushed", "dropped"), 0)
                         for name in self.rows}  # fmt: skip

    def reopened(self, restore: str | None = None) -> None:
        """Opens the shard again and checks that it holds every row the model does (every acknowledged push)."""
        self.open(restore)
        assert self.shard.clock == self.clock
        self.check_rows()

    # ---- the model ----------------------------------------------------------------------------------
    def row(self, name: str, i: int) -> np.ndarray:
        got = self.rows[name].get(i)
        return initial_row(ALL[name], i) if got is None else got

    def apply(self, batch: list[TablePush], advance: int) -> None:
        for p in batch:
            cfg = ALL[p.name]
            for k, i in enumerate(p.ids.tolist()):
                show = 1.0 if p.shows is None else float(p.shows[k])
                click = 0.0 if p.clicks is None else float(p.clicks[k])
                self.rows[p.name][i] = stepped(cfg, self.row(p.name, i), p.grads[k], show, click, self.clock,
                                                   p.add_delta)  # fmt: skip
            if len(p.ids):
                self.counters[p.name]["pushes"] += 1
                self.counters[p.name]["ids_pushed"] += len(p.ids)
        self.clock += advance

    def check_rows(self) -> None:
        ids = np.array(POOL, np.uint64)
        for name in self.rows:
            want = np.array([self.row(name, i) for i in POOL])
            assert_rows(ALL[name], self.shard.table(name).peek(ids), want)

    # ---- requests -----------------------------------------------------------------------------------
    @rule(name=st.sampled_from(["a", "g", "w", "late"]), ids=st.lists(st.sampled_from(POOL), max_size=14))
    def pull(self, name, ids):
        if name not in self.rows:
            with pytest.raises(TableNotFoundError):
                self.shard.pull(name, np.array(ids, np.uint64))
            return
        got = self.shard.pull(name, np.array(ids, np.uint64))
        want = np.array([self.row(name, i)[: ALL[name].dim] for i in ids], np.float32).reshape(-1, ALL[name].dim)
        assert_rows(ALL[name], got, want)
        self.counters[name]["pulls"] += 1
        self.counters[name]["ids_pulled"] += len(ids)

    @rule(data=st.data(), client=st.sampled_from([0, *CLIENTS]), advance=st.integers(0, 2))
    def push_batch(self, data, client, advance):
        batch = data.draw(pushes(tuple(self.rows), min_size=0))  # none: a clock advance alone
        seq = 0
        if client:
            newest = self.newest(client)
            seq = newest[0] + 1 if newest else data.draw(st.integers(1, 5))  # a client new here starts anywhere
        got = self.shard.push_batch(batch, advance, client, seq)
        self.apply(batch, advance)
        assert got == (self.clock, len(batch))
        if client:
            self.sent[client].append((seq, batch, advance))

    @rule(name=st.sampled_from(["a", "g", "w"]), data=st.data())
    def push(self, name, data):
        (p,) = data.draw(pushes((name,), max_size=1))
        self.shard.push(p.name, p.ids, p.grads, p.shows, p.clicks, p.add_delta)
        self.apply([p], 0)

    def newest(self, client: int) -> tuple[int, list[TablePush], int] | None:
        return self.sent[client][-1] if self.sent.get(client) else None

    @precondition(lambda self: any(self.sent.values()))
    @rule(data=st.data(), older=st.booleans())
    def send_again(self, data, older):
        """A request a client sent before arrives again (a retry of the newest, or a late copy of an older one): it
        is applied already, so no id of it is applied again, and the clock stays."""
        client = data.draw(st.sampled_from([c for c in CLIENTS if self.sent[c]]))
        sent = self.sent[client]
        seq, batch, advance = data.draw(st.sampled_from(sent)) if older else sent[-1]
        clock, applied = self.shard.push_batch(batch, advance, client, seq)
        assert (clock, ids_applied(batch, applied)) == (self.clock, 0)

    @rule(data=st.data(), client=st.sampled_from([0, *CLIENTS]), kind=st.sampled_from(BAD_KINDS),
          seq_kind=st.sampled_from(["next", "older", "zero", "too far"]))  # fmt: skip
    def bad_batch(self, data, client, kind, seq_kind):
        """A batch with one bad push (or a bad seq, or a clock advance out of range) is refused and changes
        nothing: no push of it is applied, the clock stays, and the client's next request still takes its seq."""
        batch = data.draw(pushes(tuple(self.rows)))
        at = data.draw(st.integers(0, len(batch) - 1))
        newest = self.newest(client)
        seq, advance = 0, data.draw(st.integers(0, 2))
        if client:
            seq = newest[0] + 1 if newest else 1
            if seq_kind == "older" and newest and newest[0] > 1:
                seq = data.draw(st.integers(1, newest[0] - 1))  # refused as a bad request all the same
            elif seq_kind == "zero":
                seq = 0
            elif seq_kind == "too far" and newest:
                seq = newest[0] + MAX_SEQ_JUMP + 1
        bad_seq = client and (seq == 0 or (newest and seq > newest[0] + MAX_SEQ_JUMP))
        applied_before = seq != 0 and newest is not None and seq < newest[0]
        if not bad_seq and not applied_before and data.draw(st.booleans()):  # a good batch, its advance out of range
            advance = MAX_CLOCK - self.clock + 1
        else:
            batch[at] = spoiled(batch[at], kind)
        error = TableNotFoundError if any(p.name == "nope" for p in batch) and not bad_seq else InvalidArgumentError
        before = {name: self.shard.table(name).stats() for name in self.rows}
        with pytest.raises(error):
            self.shard.push_batch(batch, advance, client, seq)
        assert self.shard.clock == self.clock
        for name in self.rows:
            assert self.shard.table(name).stats()["pushes"] == before[name]["pushes"]
        self.check_rows()

    @rule(data=st.data(), client=st.sampled_from(CLIENTS), advance=st.integers(0, 2), flush=st.booleans())
    def crash_between_two_pushes(self, data, client, advance, flush):
        """The first k pushes of a request are applied (and maybe flushed), then the process dies; the client's
        retry after the restart applies only the rest, and the clock advance once."""
        batch = data.draw(pushes(tuple(self.rows), min_size=2, nonempty=True))
        k = data.draw(st.integers(1, len(batch) - 1))
        newest = self.newest(client)
        seq = newest[0] + 1 if newest else 1
        for i in range(k):
            self.shard.apply_push(self.shard.check_push(batch[i]), origin=(client, seq, i, 0))
        if flush:
            self.shard.flush()
        crash(self.shard)
        self.apply(batch[:k], 0)
        self.reopened()
        assert self.shard.push_batch(batch, advance, client, seq) == (self.clock + advance, len(batch) - k)
        self.apply(batch[k:], advance)
        self.sent[client].append((seq, batch, advance))

    @rule(data=st.data(), client=st.sampled_from(CLIENTS), shrink=st.booleans())
    def concurrent_requests(self, data, client, shrink):
        """Batches of client 0 and a request of an exactly-once client sent twice at once (its retry overtakes its
        first attempt), alongside a flush and maybe a shrink: the request is applied once. Their pushes go to
        table w, whose rows hold small multiples of 0.5, so the order they are applied in changes no bit."""
        batches = [data.draw(pushes(("w",), min_size=0)) for _ in range(2)]
        request = data.draw(pushes(("w",)))
        newest = self.newest(client)
        seq = newest[0] + 1 if newest else 1
        old = [i for i, r in self.rows["a"].items() if r[-STATS_FLOATS + LAST_STEP] < self.clock - TTL]
        with ThreadPoolExecutor(6) as pool:
            plain = [pool.submit(self.shard.push_batch, b, 0) for b in batches]
            twice = [pool.submit(self.shard.push_batch, request, 0, client, seq) for _ in range(2)]
            flushed = pool.submit(self.shard.flush)
            shrunk = pool.submit(self.shard.shrink, "a") if shrink else None
            assert [f.result() for f in plain] == [(self.clock, len(b)) for b in batches]
            replies = [f.result() for f in twice]
            flushed.result()
            if shrunk is not None:
                assert shrunk.result()["dropped"] == len(old)
        assert [clock for clock, _ in replies] == [self.clock] * 2
        assert sum(ids_applied(request, applied) for _, applied in replies) == sum(len(p.ids) for p in request)
        for b in [*batches, request]:
            self.apply(b, 0)
        self.sent[client].append((seq, request, 0))
        if shrink:
            for i in old:
                del self.rows["a"][i]
            self.counters["a"]["dropped"] += len(old)

    @rule(steps=st.integers(0, 3))
    def advance_clock(self, steps):
        assert self.shard.advance_clock(steps) == self.clock + steps
        self.clock += steps

    @rule(one_table=st.booleans())
    def shrink(self, one_table):
        """Table a drops the ids last pushed more than TTL steps ago (its flush first leaves none pushed since)."""
        got = self.shard.shrink("a" if one_table else "")
        old = [i for i, r in self.rows["a"].items() if r[-STATS_FLOATS + LAST_STEP] < self.clock - TTL]
        for i in old:
            del self.rows["a"][i]
        self.counters["a"]["dropped"] += len(old)
        shrunk = ["a"] if one_table else list(self.rows)
        unruled = sorted(n for n in shrunk if n != "a")  # a has the only eviction rule; in any order
        got["tables_without_rule"] = sorted(got["tables_without_rule"])
        assert got == {"dropped": len(old), "num_rows": sum(len(self.rows[n]) for n in shrunk), "pending_ids": 0,
                       "tables_without_rule": unruled}  # fmt: skip

    @precondition(lambda self: "late" not in self.rows)
    @rule()
    def create_late_table(self):
        """A table created once the others fill the RAM tier takes its share back from them."""
        self.shard.create_table(LATE)
        self.rows["late"] = {}
        self.counters["late"] = dict.fromkeys(self.counters["a"], 0)

    @rule()
    def clients_unused_past_the_retention_are_forgotten(self):
        """The exactly-once table drops clients unused for REQUEST_RETENTION_S at a flush: such a client is a new
        one after (its next request, of any seq, is applied), across restarts and crashes too."""
        self.now += REQUEST_RETENTION_S + 1
        self.shard.flush()
        assert len(self.shard.journal.applied) == 0
        self.sent = {c: [] for c in CLIENTS}

    # ---- durability ---------------------------------------------------------------------------------
    @rule()
    def flush(self):
        self.shard.flush()
        for name in self.rows:
            s = self.shard.table(name).stats()
            assert s["dirty_rows"] == 0 and s["rows_on_disk"] == len(self.rows[name])

    @rule()
    def check(self):
        self.check_rows()

    @rule()
    def clean_restart(self):
        self.shard.close()
        self.reopened()

    @rule(point=st.sampled_from([None, *FLUSH_CRASH_POINTS]), data=st.data())
    def crash(self, point, data):
        """kill -9, anywhere: between requests or inside a flush, while a push is acknowledged during it."""
        late: list[TablePush] = []
        if point is not None and data.draw(st.booleans()):
            late = data.draw(pushes(tuple(self.rows)))

        def meanwhile():
            self.shard.push_batch(late, 0)

        crash(self.shard, point, meanwhile if late else None)
        self.apply(late, 0)
        self.reopened()

    @rule(kill_source=st.booleans())
    def checkpoint_and_restore(self, kill_source):
        """A checkpoint of the shard restored into a new data dir, and the run goes on there. A restored shard
        holds no client's requests (they start at any seq): its exactly-once table is the new dir's."""
        ckpt = os.path.join(self.root, f"ckpt-{self.dirs}")
        one_shard_checkpoint(self.shard, ckpt, [ALL[name] for name in self.shard.tables])
        if kill_source:
            crash(self.shard)
        else:
            self.shard.close()
        shutil.rmtree(self.dir)
        self.dir = self.new_dir()
        self.sent = {c: [] for c in CLIENTS}
        self.reopened(restore=ckpt)
        shutil.rmtree(ckpt)

    # ---- invariants ---------------------------------------------------------------------------------
    @invariant()
    def stats_match_the_model(self):
        if not hasattr(self, "shard"):
            return
        stats = self.shard.stats()
        assert stats["clock"] == self.clock
        assert stats["ram_used_bytes"] <= stats["ram_budget_bytes"] == RAM_TIER
        tables = {t["name"]: t for t in stats["tables"]}
        assert sorted(tables) == sorted(self.rows)
        for name, t in tables.items():
            assert (t["num_rows"], t["pending_ids"]) == (len(self.rows[name]), 0), name
            assert {k: t[k] for k in self.counters[name]} == self.counters[name], name
        assert sum(t["ram_bytes"] for t in tables.values()) == stats["ram_used_bytes"]

    def teardown(self):
        if hasattr(self, "shard"):
            self.shard.close()
        self.wall.stop()
        shutil.rmtree(self.root, ignore_errors=True)


TestShardModel = ShardModel.TestCase
# 15 runs of up to 40 steps: each rule (the crash points and restores included) runs a few dozen times a test run,
# but the late table's at most once a run (its precondition), in about 6 of them; a run costs about a second (every
# restart opens RocksDB), so more runs buy repeats, not rules.
TestShardModel.settings = settings(max_examples=15, stateful_step_count=40, deadline=None)
