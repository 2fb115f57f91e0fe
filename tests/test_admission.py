"""Statistics, admission and Shrink against a dict model, under random pushes, clock steps, shrinks, flushes,
restarts and crashes, with a RAM tier so small that rows move to and from RocksDB all the time."""

import shutil
import tempfile
import threading

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from ps.config import AdmissionConfig, EvictionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.readahead import ReadAhead
from ps.engine.shard import Shard
from ps.rows.initializers import init_rows
from ps.rows.layout import layout_of
from ps.server_config import ServerConfig
from ps.storage import budget as budget_module
from tests.conftest import crash

EV = EvictionConfig(ttl_steps=3, score_threshold=0.9, decay=0.5, nonclk_coeff=0.25, click_coeff=1.0)
CFG = TableConfig(
    "t", 2, InitializerConfig("uniform", 0.5, seed=3), OptimizerConfig("sgd", 1.0),
    admission=AdmissionConfig(min_count=2), eviction=EV,
)  # fmt: skip
POOL = list(range(20)) + [2**64 - 1]


def initial(i):
    out = np.empty((1, 2), dtype=np.float32)
    init_rows(CFG.initializer, np.array([i], dtype=np.uint64), out, 2)
    return out[0]


TINY_RAM_TIER = 8 * layout_of(2, "sgd").ram_bytes  # 8 rows


@pytest.fixture(autouse=True)
def tiny_shares(monkeypatch):
    """A RAM tier of 8 rows holds a table: a share may be one row here (MIN_SHARE_ROWS rows otherwise)."""
    monkeypatch.setattr(budget_module, "MIN_SHARE_ROWS", 1)


class AdmissionModel(RuleBasedStateMachine):
    """Model per id: show, click, last step, admitted, weights (SGD lr=1 from the initial value once admitted)."""

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="admission-sm-")
        self.ids: dict[int, dict] = {}
        self.clock = 0

    @initialize()
    def open(self):
        self.shard = Shard(ServerConfig(data_dir=self.dir, cache_bytes=TINY_RAM_TIER, flush_interval_s=3600))
        self.table = self.shard.create_table(CFG)

    @rule(ids=st.lists(st.sampled_from(POOL), unique=True, min_size=1, max_size=12), data=st.data())
    def push(self, ids, data):
        n = len(ids)
        grads = np.array(data.draw(st.lists(st.integers(-3, 3), min_size=2 * n, max_size=2 * n)), np.float32).reshape(
            n, 2
        )
        shows = np.array(data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n)), dtype=np.float32)
        clicks = np.array([data.draw(st.integers(0, int(s))) for s in shows], dtype=np.float32)
        self.shard.push("t", np.array(ids, dtype=np.uint64), grads, shows, clicks)
        for k, i in enumerate(ids):
            m = self.ids.setdefault(i, {"show": 0.0, "click": 0.0, "step": 0, "admitted": False, "w": initial(i)})
            m["show"] += shows[k]
            m["click"] += clicks[k]
            m["step"] = self.clock
            m["admitted"] = m["admitted"] or m["show"] >= 2
            if m["admitted"]:
                m["w"] = m["w"] - grads[k]

    @rule(steps=st.integers(1, 3))
    def tick(self, steps):
        self.clock = self.shard.advance_clock(steps)

    @rule()
    def shrink(self):
        self.shard.shrink("t")
        for i, m in list(self.ids.items()):
            m["show"] *= EV.decay
            m["click"] *= EV.decay
            score = (m["show"] - m["click"]) * EV.nonclk_coeff + m["click"] * EV.click_coeff
            if m["step"] < self.clock - EV.ttl_steps or score < EV.score_threshold:
                del self.ids[i]

    @rule(ids=st.lists(st.sampled_from(POOL), max_size=10))
    def pull(self, ids):
        got = self.shard.pull("t", np.array(ids, dtype=np.uint64))
        want = [self.ids[i]["w"] if i in self.ids else initial(i) for i in ids]
        np.testing.assert_array_equal(got, np.array(want, dtype=np.float32).reshape(-1, 2))

    @rule()
    def flush(self):
        self.shard.flush()

    @rule()
    def restart(self):
        self.shard.close()
        self.open()

    @rule()
    def crash(self):
        crash(self.shard)
        self.open()

    @invariant()
    def statistics_and_counts_match(self):
        if not hasattr(self, "table") or not self.ids:
            return
        ids = sorted(self.ids)
        rows = self.table.peek(np.array(ids, dtype=np.uint64))
        sc = self.table.stats_col
        for row, i in zip(rows, ids):
            m = self.ids[i]
            assert (row[sc], row[sc + 1], row[sc + 2], row[sc + 3]) == (m["show"], m["click"], m["step"], m["admitted"])
        assert self.table.num_rows == sum(m["admitted"] for m in self.ids.values())
        assert self.table.num_pending == sum(not m["admitted"] for m in self.ids.values())

    def teardown(self):
        self.shard.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestAdmissionModel = AdmissionModel.TestCase
# 12 runs of up to 30 steps (long enough for ids to age past the TTL): each rule runs a few dozen times a test run.
TestAdmissionModel.settings = settings(max_examples=12, stateful_step_count=30, deadline=None)


def test_probabilistic_admission_admits_about_p_of_new_ids(tmp_path):
    cfg = TableConfig("p", 2, admission=AdmissionConfig(probability=0.25))
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    shard.create_table(cfg)
    ids = np.arange(20000, dtype=np.uint64)
    shard.push("p", ids, np.ones((len(ids), 2), dtype=np.float32))
    assert abs(shard.table("p").num_rows / len(ids) - 0.25) < 0.02
    shard.push("p", ids, np.ones((len(ids), 2), dtype=np.float32))  # a second chance for the rest
    assert abs(shard.table("p").num_rows / len(ids) - (1 - 0.75**2)) < 0.02
    shard.close()


def test_a_row_pushed_while_a_shrink_runs_is_kept_so_a_crash_replays_to_the_same_rows(tmp_path):
    """A push lands between Shard.shrink's flush and the table's scan, and the process dies before the shrink's
    last flush. Dropping that row would not last: the journal's replay of the push (a drop is not journaled)
    would bring it back after the restart, under the push acknowledged after the shrink. The row is kept
    instead, so the rows after the restart are the rows before the kill."""
    d = str(tmp_path / "d")
    cfg = TableConfig("t", 2, InitializerConfig("zeros", 0.0, seed=1), OptimizerConfig("sgd", 1.0),
                      eviction=EvictionConfig(score_threshold=1.0))  # show s, no click: score 0.1 s < 1  # fmt: skip
    shard = Shard(ServerConfig(data_dir=d, flush_interval_s=3600))
    table = shard.create_table(cfg)
    x, y, one = np.array([7], np.uint64), np.array([8], np.uint64), np.full((1, 2), -1.0, np.float32)
    shard.push("t", np.concatenate([x, y]), np.full((2, 2), -1.0, np.float32))
    shard.flush()  # both in RocksDB
    scan, flush, flushes = table.shrink, shard.flush, []

    def a_push_comes_first(clock: int, **kwargs: object) -> int:
        shard.push("t", x, one)  # x dirty in RAM, its lsn past the flushed seq (score 0.2: under the threshold)
        return scan(clock, **kwargs)

    def dies_at_the_second_flush() -> int:
        flushes.append(1)
        if len(flushes) == 2:
            raise KeyboardInterrupt  # stands for kill -9 before the shrink's last flush
        return flush()

    table.shrink, shard.flush = a_push_comes_first, dies_at_the_second_flush
    with pytest.raises(KeyboardInterrupt):
        shard.shrink()
    assert table.peek(y)[0, :2].tolist() == [0.0, 0.0]  # y dropped: its row is an initial one again
    np.testing.assert_array_equal(table.peek(x)[0, :2], [2.0, 2.0])  # x kept, its two pushes in it
    shard.push("t", x, one)  # acknowledged after the shrink
    before = table.peek(np.concatenate([x, y])).copy()
    crash(shard)
    shard = Shard(ServerConfig(data_dir=d, flush_interval_s=3600))
    try:
        np.testing.assert_array_equal(shard.table("t").peek(np.concatenate([x, y])), before)
    finally:
        shard.close()


def test_a_crash_loses_evicted_rows_still_waiting_for_their_write_and_the_replay_gives_them_back(tmp_path):
    """The write-behind thread is stalled, so the rows each push evicts wait in memory; the crash loses every
    batch but the one being written (tests.conftest.crash, as kill -9), and the journal's replay rebuilds them:
    every id's row after the restart is the one before the kill."""
    d = str(tmp_path / "d")
    shard = Shard(ServerConfig(data_dir=d, cache_bytes=TINY_RAM_TIER, flush_interval_s=3600))
    table = shard.create_table(CFG)
    behind = shard.store._behind
    write, stalled = behind._write, threading.Event()

    def stalls(batch) -> None:
        stalled.wait(60)
        write(batch)

    behind._write = stalls
    rng = np.random.default_rng(3)
    ids = np.arange(1, 41, dtype=np.uint64)  # 40 ids through an 8-row RAM tier: most pushes evict dirty rows
    for _ in range(30):
        some = rng.choice(ids, 6, replace=False)
        shard.push("t", some, rng.integers(-3, 4, (6, 2)).astype(np.float32), shows=np.ones(6, np.float32),
                   clicks=np.zeros(6, np.float32))  # fmt: skip
    assert len(behind._pending) > 1, len(behind._pending)  # batches waiting: the crash loses them
    before = table.peek(ids).copy()
    threading.Timer(0.2, stalled.set).start()  # the batch being written may land or not
    crash(shard)
    shard = Shard(ServerConfig(data_dir=d, cache_bytes=TINY_RAM_TIER, flush_interval_s=3600))
    try:
        np.testing.assert_array_equal(shard.table("t").peek(ids), before)
    finally:
        shard.close()


def test_a_shrink_writes_only_the_rows_it_changes(tmp_path):
    """With decay 1 a kept row is as it was, so a shrink deletes the ids it drops and writes no other row (and a read
    ahead out meanwhile reads again only those), and one that drops nothing writes nothing; a table with no rule on
    is left alone. The rows are the same after a restart."""
    d = str(tmp_path / "d")
    ttl = TableConfig("ttl", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0),
                      eviction=EvictionConfig(ttl_steps=5))  # fmt: skip
    plain = TableConfig("plain", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0))
    shard = Shard(ServerConfig(data_dir=d, flush_interval_s=3600))
    ids, recent = np.arange(100, dtype=np.uint64), np.arange(10, dtype=np.uint64)
    for cfg in (ttl, plain):
        shard.create_table(cfg)
        shard.push(cfg.name, ids, np.ones((100, 2), np.float32))
    shard.advance_clock(10)
    for name in ("ttl", "plain"):
        shard.push(name, recent, np.ones((10, 2), np.float32))
    shard.flush()
    before = {name: shard.table(name).peek(ids).copy() for name in ("ttl", "plain")}
    writes, put_rows = [], shard.store.put_rows

    def counted(table, ids, rows, *args, delete=None, **kwargs):
        writes.append((table, len(ids), 0 if delete is None else len(delete)))
        return put_rows(table, ids, rows, *args, delete=delete, **kwargs)

    shard.store.put_rows = counted
    ahead = ReadAhead(ids)  # a pull's read of every id, out meanwhile: it reads again only the ids deleted
    shard.table("ttl").reads_ahead.add(ahead)
    assert shard.shrink()["dropped"] == 90
    assert writes == [("ttl", 0, 90)], writes
    assert sorted(np.concatenate(ahead.written).tolist()) == ids[10:].tolist()
    shard.table("ttl").reads_ahead.end(ahead)
    writes.clear()
    assert shard.shrink()["dropped"] == 0  # the ids left were pushed within ttl_steps: nothing to write
    assert writes == [], writes
    want = {"ttl": np.where(np.isin(ids, recent)[:, None], before["ttl"], 0), "plain": before["plain"]}
    for name in ("ttl", "plain"):
        np.testing.assert_array_equal(shard.table(name).peek(ids), want[name])
    shard.close()
    shard = Shard(ServerConfig(data_dir=d, flush_interval_s=3600))
    try:
        for name in ("ttl", "plain"):
            np.testing.assert_array_equal(shard.table(name).peek(ids), want[name])
        assert (shard.table("ttl").num_rows, shard.table("plain").num_rows) == (10, 100)
    finally:
        shard.close()


def test_a_shrink_whose_write_fails_keeps_the_tables_counts(tmp_path):
    """A Shrink chunk whose RocksDB write fails drops nothing: the table's counts stay those of the rows it holds,
    and a Shrink sent again drops the ids and counts them off once."""
    from ps.errors import StorageError

    ttl = TableConfig("ttl", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0),
                      eviction=EvictionConfig(ttl_steps=5))  # fmt: skip
    shard = Shard(ServerConfig(data_dir=str(tmp_path), flush_interval_s=3600))
    try:
        shard.create_table(ttl)
        shard.push("ttl", np.arange(100, dtype=np.uint64), np.ones((100, 2), np.float32))
        shard.advance_clock(10)
        shard.push("ttl", np.arange(10, dtype=np.uint64), np.ones((10, 2), np.float32))
        shard.flush()
        put_rows = shard.store.put_rows

        def disk_full(*args: object, **kwargs: object) -> None:
            raise StorageError("disk full")

        shard.store.put_rows = disk_full
        with pytest.raises(StorageError, match="disk full"):
            shard.shrink()
        assert (shard.table("ttl").num_rows, shard.table("ttl").num_pending) == (100, 0)
        shard.store.put_rows = put_rows
        assert shard.shrink()["dropped"] == 90
        assert (shard.table("ttl").num_rows, shard.table("ttl").num_pending) == (10, 0)
    finally:
        shard.close()


def _decaying_shard(path, tables: str) -> Shard:
    """A shard whose tables (one per letter) decay show and click by half at each Shrink, each holding ids 0-29 with
    one show each, flushed."""
    shard = Shard(ServerConfig(data_dir=str(path), flush_interval_s=3600))
    for name in tables:
        shard.create_table(TableConfig(name, 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0),
                                       eviction=EvictionConfig(decay=0.5)))  # fmt: skip
        shard.push(name, np.arange(30, dtype=np.uint64), np.ones((30, 2), np.float32))
    shard.flush()
    return shard


def _shows(shard: Shard, name: str) -> np.ndarray:
    from ps.rows.layout import SHOW

    table = shard.table(name)
    return table.peek(np.arange(30, dtype=np.uint64))[:, table.stats_col + SHOW]


def test_a_shrink_that_stops_part_way_says_what_it_shrunk(tmp_path, monkeypatch):
    """Tables a, b, c; b is shrunk in chunks of 10 rows, and the write of its second chunk fails: a's rows and b's
    first 10 are decayed and stay so, and the refusal says so (PARTLY_APPLIED: the client does not send it again),
    not that nothing was applied."""
    import functools

    from ps.engine.table import Table
    from ps.errors import PARTLY_APPLIED, StorageError

    shard = _decaying_shard(tmp_path, "abc")
    try:
        b = shard.table("b")
        monkeypatch.setattr(b, "shrink", functools.partial(Table.shrink, b, chunk_rows=10))
        put_rows, writes = shard.store.put_rows, []

        def second_of_b_fails(table, *args, **kwargs):
            writes.append(table)
            if writes.count("b") == 2:
                raise StorageError("RocksDB failed while writing rows of table 'b': disk gone; nothing was applied")
            return put_rows(table, *args, **kwargs)

        monkeypatch.setattr(shard.store, "put_rows", second_of_b_fails)
        with pytest.raises(StorageError) as refused:
            shard.shrink()
        assert str(refused.value) == (
            "shrink stopped: RocksDB failed while writing rows of table 'b': disk gone. Of the Shrink, table 'a' was "
            "shrunk whole ('a': 30 rows decayed and 0 ids dropped); table 'b' was shrunk in part (10 rows decayed and "
            "0 ids dropped so far); table 'c' was not shrunk: those changes were applied, and the clock was not "
            "advanced; send no Shrink before the next one is due: one sent again would decay the rows shrunk already "
            "a second time, and the next shrinks what this one left (tables 'b', 'c')"
        )
        assert PARTLY_APPLIED in str(refused.value)
        assert (_shows(shard, "a") == 0.5).all() and (_shows(shard, "c") == 1).all()
        assert sorted(_shows(shard, "b").tolist()) == [0.5] * 10 + [1.0] * 20
    finally:
        monkeypatch.undo()
        shard.close()


def _writes_of_b_fail(shard, monkeypatch, error: Exception) -> None:
    """The shard's row writes of table 'b' raise `error`; the other tables' are written."""
    put_rows = shard.store.put_rows

    def b_fails(table, *args, **kwargs):
        if table == "b":
            raise error
        return put_rows(table, *args, **kwargs)

    monkeypatch.setattr(shard.store, "put_rows", b_fails)


def test_a_shrink_that_stops_at_the_first_chunk_of_a_table_says_that_table_was_not_shrunk(tmp_path, monkeypatch):
    """Tables a, b; a is shrunk, the write of b's first chunk fails: b is untouched, and the refusal says so."""
    from ps.errors import StorageError

    shard = _decaying_shard(tmp_path, "ab")
    try:
        _writes_of_b_fail(shard, monkeypatch,
                          StorageError("RocksDB failed while writing rows of table 'b': disk gone; nothing was applied"))  # fmt: skip
        with pytest.raises(StorageError) as refused:
            shard.shrink()
        assert "Of the Shrink, table 'a' was shrunk whole ('a': 30 rows decayed and 0 ids dropped); table 'b' was " \
            "not shrunk: those changes were applied" in str(refused.value)  # fmt: skip
        assert (_shows(shard, "a") == 0.5).all() and (_shows(shard, "b") == 1).all()
    finally:
        monkeypatch.undo()
        shard.close()


def test_a_shrink_that_stops_part_way_on_a_full_disk_stays_a_disk_full_error(tmp_path, monkeypatch):
    """A DiskFullError that stops a Shrink part way is raised as one still: its reason, what and disk kept, its
    message starting as every DiskFullError's does, and saying what of the Shrink stays. Its one instruction is to
    wait for the next Shrink (a Shrink sent again would decay table 'a' a second time), not to retry."""
    from ps.diskfull import DISK_FULL_PREFIX, DiskFullError
    from ps.errors import PARTLY_APPLIED

    shard = _decaying_shard(tmp_path, "ab")
    try:
        what = "RocksDB in the data dir failed while writing rows of table 'b'"
        _writes_of_b_fail(shard, monkeypatch, DiskFullError.of("Disk quota exceeded", what, disk=str(tmp_path)))
        with pytest.raises(DiskFullError) as refused:
            shard.shrink()
        e = refused.value
        assert (e.reason, e.what, e.disk) == ("Disk quota exceeded", what, str(tmp_path))
        assert str(e).startswith(f"{DISK_FULL_PREFIX} (Disk quota exceeded): {what}; free space on the disk of ")
        assert str(e).endswith(f"(or raise the quota) and wait for the next Shrink; shrink stopped. Of the Shrink, "
                               f"table 'a' was shrunk whole ('a': 30 rows decayed and 0 ids dropped); table 'b' was not "
                               f"shrunk: those changes were {PARTLY_APPLIED}; send no Shrink before the next one is "
                               f"due: one sent again would decay the rows shrunk already a second time, and the next "
                               f"shrinks what this one left (table 'b')")  # fmt: skip
        assert "nothing was applied" not in str(e) and "retry" not in str(e)
        assert e.remedy == "wait for the next Shrink"
    finally:
        monkeypatch.undo()
        shard.close()


def test_a_shrink_whose_last_flush_fails_says_every_table_was_shrunk(tmp_path, monkeypatch):
    from ps.errors import PARTLY_APPLIED, StorageError

    shard = _decaying_shard(tmp_path, "ab")
    try:
        flushes, set_flushed_seq = [], shard.store.meta.set_flushed_seq

        def second_fails(*args, **kwargs):
            flushes.append(args)
            if len(flushes) == 2:  # the flush after the tables were shrunk
                raise StorageError("RocksDB failed while recording the flushed journal position: disk gone")
            return set_flushed_seq(*args, **kwargs)

        monkeypatch.setattr(shard.store.meta, "set_flushed_seq", second_fails)
        with pytest.raises(StorageError) as refused:
            shard.shrink()
        assert "Of the Shrink, tables 'a', 'b' were shrunk whole ('a': 30 rows decayed" in str(refused.value)
        assert PARTLY_APPLIED in str(refused.value)
        assert (_shows(shard, "a") == 0.5).all() and (_shows(shard, "b") == 0.5).all()
    finally:
        monkeypatch.undo()
        shard.close()


def test_a_shrink_whose_last_flush_finds_the_shard_broken_says_so_then_what_it_shrunk(tmp_path, monkeypatch):
    """The flush after the tables were shrunk finds the shard broken: its ShardNeedsRestartError, whose message says
    what a restart does, is raised with that message first, then what of the Shrink stays (a restart keeps the rows
    decayed, and a Shrink sent again would decay them a second time). Where nothing was shrunk, it is raised as it
    is."""
    from ps.errors import PARTLY_APPLIED, ShardNeedsRestartError

    shard = _decaying_shard(tmp_path, "ab")
    try:
        flush, flushes = shard.flush, []
        broken = ShardNeedsRestartError("push 3 of table 'a' failed part way; restart the server to replay it")

        def second_finds_it_broken(*args, **kwargs) -> int:
            flushes.append(args)
            if len(flushes) == 2:  # the flush after the tables were shrunk
                raise broken
            return flush(*args, **kwargs)

        monkeypatch.setattr(shard, "flush", second_finds_it_broken)
        with pytest.raises(ShardNeedsRestartError) as refused:
            shard.shrink()
        assert str(refused.value) == (
            f"{broken}; shrink stopped. Of the Shrink, tables 'a', 'b' were shrunk whole ('a': 30 rows decayed and 0 "
            f"ids dropped; 'b': 30 rows decayed and 0 ids dropped): those changes were {PARTLY_APPLIED}; send no "
            "Shrink before the next one is due: one sent again would decay the rows shrunk already a second time"
        )
        assert (_shows(shard, "a") == 0.5).all() and (_shows(shard, "b") == 0.5).all()
        flushes.clear()  # the first flush of the next Shrink passes

        def finds_it_broken(*args, **kwargs):
            raise broken

        monkeypatch.setattr(shard.tables["a"], "shrink", finds_it_broken)
        with pytest.raises(ShardNeedsRestartError) as refused:
            shard.shrink()
        assert refused.value is broken
    finally:
        monkeypatch.undo()
        shard.close()
