"""CreateTable across shards: a refusal by any shard leaves every shard as it was.

Client.create_table asks every shard to check the request first (CreateTable's check_only) and creates the table
only once all accepted. The oracle for the check is create_table itself: on twin shards brought to the same
state, Shard.check_create answers what create_table answers (the table's spec, rows and width, or the same
error), and changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from protos import ps_pb2
from ps import codec
from ps.config import AdmissionConfig, EvictionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.engine import tablemaker
from ps.engine.shard import Shard
from ps.errors import (
    DataLossError,
    InvalidArgumentError,
    PsError,
    RamTierTooSmallError,
    TableExistsError,
    TableNotFoundError,
    TableNumbersExhaustedError,
)
from ps.server import Server
from ps.server_config import ServerConfig
from ps.storage.budget import MIN_SHARE_BYTES
from ps.storage.store import Store
from worker.client import Client

WIDE = 4096  # a 4 MiB RAM tier takes 4 tables of this dim (adagrad), not 5 (tests/test_many_tables.py)
SMALL_TIER = 4 << 20
STRAY_COUNTS = b'{"admitted": 7, "pending": 2, "trained": true}'  # a count/ value of a name no table has
FTRL_NO_BETA_L2 = OptimizerConfig("ftrl", 0.05, {"beta": 0.0, "l2": 0.0, "l1": 0.1})  # w at n = 0: 0 only


def trained(shard: Shard, name: str, dim: int) -> None:
    """Pushes 3 ids the shard owns to its table `name`."""
    ids = np.arange(1000, dtype=np.uint64)
    if shard.num_shards > 1:
        ids = ids[shard.slot_map.shard_of(ids) == shard.shard_id]
    shard.push(name, ids[:3], np.ones((3, dim), np.float32))


# each: (what is on the shard first, the request); the shard has a 4 MiB RAM tier
SCENARIOS = {
    "new table": ([], (TableConfig("t", 4), False)),
    "the same spec again": ([("t", 4, False)], (TableConfig("t", 4), False)),
    "the same spec again, trained": ([("t", 4, True)], (TableConfig("t", 4), True)),
    "another spec": ([("t", 4, False)], (TableConfig("t", 8), False)),
    "another spec, untrained, replaced": ([("t", 4, False)], (TableConfig("t", 8), True)),
    "another spec, trained, not replaced": ([("t", 4, True)], (TableConfig("t", 8), True)),
    "another optimizer": ([("t", 4, False)], (TableConfig("t", 4, optimizer=OptimizerConfig("sgd", 0.1)), False)),
    "ftrl without beta and l2, the default initializer": ([], (TableConfig("t", 4, optimizer=FTRL_NO_BETA_L2), False)),
    "ftrl without beta and l2, replacing": ([("t", 4, False)], (TableConfig("t", 4, optimizer=FTRL_NO_BETA_L2), True)),
    "ftrl without beta and l2, zeros": (
        [], (TableConfig("t", 4, initializer=InitializerConfig("zeros"), optimizer=FTRL_NO_BETA_L2), False)),
    "one table too many": ([(f"w{i}", WIDE, False) for i in range(4)], (TableConfig("t", WIDE), False)),
    "a wide table replacing a narrow one, room": (
        [*((f"w{i}", WIDE, False) for i in range(3)), ("t", 4, False)], (TableConfig("t", WIDE), True)),
    "a wide table replacing a narrow one, no room": (
        [("t", 4, False), *((f"u{i}", 4, False) for i in range(4))], (TableConfig("t", WIDE), True)),
    "one table too many, a table's number unreadable": (
        [(f"w{i}", WIDE, False) for i in range(4)], (TableConfig("t", WIDE), False), {b"tid/w3": b"zero"}),
    "one table too many, no table number left": (
        [(f"w{i}", WIDE, False) for i in range(4)], (TableConfig("t", WIDE), False), {b"tid/w3": b"4294967295"}),
    "a new table whose count/ key does not read": ([], (TableConfig("t", 4), False), {b"count/t": b"zero"}),
    "a new table with a stray count/ key": ([], (TableConfig("t", 4), False), {b"count/t": STRAY_COUNTS}),
    "one table too many, its count/ key not reading": (
        [(f"w{i}", WIDE, False) for i in range(4)], (TableConfig("t", WIDE), False), {b"count/t": b"zero"}),
    "a wide table replacing a narrow one, no room, its number unreadable": (
        [("t", 4, False), *((f"u{i}", 4, False) for i in range(4))], (TableConfig("t", WIDE), True),
        {b"tid/t": b"zero"}),
}  # fmt: skip
REFUSALS = (TableExistsError, RamTierTooSmallError, InvalidArgumentError, DataLossError, TableNumbersExhaustedError)


def prepared(path, setup, damage=None) -> Shard:
    """A shard holding the tables of setup, opened again after each meta value of damage (key -> value) is put."""
    shard = Shard(ServerConfig(data_dir=str(path), cache_bytes=SMALL_TIER, flush_interval_s=3600))
    for name, dim, train in setup:
        shard.create_table(TableConfig(name, dim))
        if train:
            trained(shard, name, dim)
    if damage:
        shard.close()
        store = Store(str(path))
        for key, value in damage.items():
            store._dir.meta_cf.put(key, value)
        store.close()
        shard = Shard(ServerConfig(data_dir=str(path), cache_bytes=SMALL_TIER, flush_interval_s=3600))
    return shard


def outcome(data_dir, call, *args, **kwargs):
    """call's answer as (config dict, rows, width), or its refusal as (error class name, message with data_dir, the
    shard's, written as DIR)."""
    try:
        cfg, rows, width = call(*args, **kwargs)
    except REFUSALS as e:
        return type(e).__name__, str(e).replace(str(data_dir), "DIR")
    return cfg.to_dict(), rows, width


def state(shard: Shard) -> dict:
    return {name: (t.cfg.to_dict(), t.num_rows, t.num_pending) for name, t in shard.tables.items()}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_check_create_answers_what_create_table_does_and_changes_nothing(tmp_path, scenario):
    setup, (cfg, replace), *damage = SCENARIOS[scenario]
    checked, created = prepared(tmp_path / "a", setup, *damage), prepared(tmp_path / "b", setup, *damage)
    try:
        before = state(checked)
        check = outcome(tmp_path / "a", checked.check_create, cfg, replace_untrained=replace)
        assert state(checked) == before
        assert checked.budget.used_bytes == created.budget.used_bytes

        def create():
            t = created.create_table(cfg, replace_untrained=replace)
            return t.cfg, t.num_rows, t.width

        assert check == outcome(tmp_path / "b", create)
    finally:
        checked.close()
        created.close()


def test_the_scenarios_cover_each_outcome(tmp_path):
    """The oracle test above is only as good as its cases: each kind of answer comes up."""
    kinds = set()
    for i, (setup, (cfg, replace), *damage) in enumerate(SCENARIOS.values()):
        shard = prepared(tmp_path / str(i), setup, *damage)
        try:
            got = outcome(tmp_path / str(i), shard.check_create, cfg, replace_untrained=replace)
        finally:
            shard.close()
        kinds.add(got[0] if isinstance(got[0], str) else ("existing" if got[1] else "created"))
    assert kinds == {
        "TableExistsError",
        "RamTierTooSmallError",
        "InvalidArgumentError",
        "DataLossError",
        "TableNumbersExhaustedError",
        "existing",
        "created",
    }


@pytest.fixture
def two_shards(tmp_path):
    """Factory: shards 0 and 1 of 2, in-process servers, with the given --cache-bytes each."""
    started: list[Server] = []

    def start(cache_bytes=(None, None)):
        for i, cache in enumerate(cache_bytes):
            s = Server(ServerConfig(data_dir=str(tmp_path / f"shard-{i}"), shard_id=i, num_shards=2, port=0,
                                    cache_bytes=cache))  # fmt: skip
            s.start()
            started.append(s)
        return [f"127.0.0.1:{s.port}" for s in started], started

    yield start
    for s in started:
        s.stop(grace_s=1)


def test_a_table_one_shard_refuses_is_created_on_none(two_shards):
    """Shard 1 holds table t of another spec, trained; shard 0 none. CreateTable of t is refused
    (ALREADY_EXISTS, naming shard 1) and shard 0 still has no table t; then the other spec goes through."""
    addresses, (s0, s1) = two_shards()
    s1.shard.create_table(TableConfig("t", 4))
    trained(s1.shard, "t", 4)
    with Client(addresses) as client:
        with pytest.raises(PsError, match=r"table 't' exists on shard 1 with a different spec") as e:
            client.create_table(TableConfig("t", 8), replace_untrained=True)
        assert e.value.status == "ALREADY_EXISTS"
        assert "t" not in s0.shard.tables
        client.create_table(TableConfig("t", 4))
        assert s0.shard.table("t").dim == 4


def test_a_table_one_shards_ram_tier_cannot_take_is_created_on_none(two_shards):
    """Shard 1's RAM tier (4 MiB) takes 4 tables of dim 4096, shard 0's (2 GiB) many more: the 5th is refused
    (RESOURCE_EXHAUSTED, naming --cache-bytes) and shard 0 does not hold it."""
    addresses, (s0, s1) = two_shards((None, SMALL_TIER))
    with Client(addresses) as client:
        for i in range(4):
            client.create_table(TableConfig(f"w{i}", WIDE))
        with pytest.raises(PsError, match=r"--cache-bytes 4.0 MiB\) cannot take table number 5") as e:
            client.create_table(TableConfig("w4", WIDE))
        assert e.value.status == "RESOURCE_EXHAUSTED"
        # its fields cross with it: 5 tables, each share at least MIN_SHARE_BYTES (rows of over 4 KiB)
        fields = (e.value.tables, e.value.floor_bytes, e.value.budget)
        assert (type(e.value), *fields) == (RamTierTooSmallError, 5, MIN_SHARE_BYTES, "cache")
        assert sorted(s0.shard.tables) == sorted(s1.shard.tables) == [f"w{i}" for i in range(4)]
        with pytest.raises(TableNotFoundError):
            client.describe_table("w4")


def test_check_only_over_the_wire_creates_nothing_and_answers_as_create_would(two_shards):
    addresses, (s0, _) = two_shards()
    cfg = TableConfig("t", 4)
    check = ps_pb2.CreateTableRequest(spec=codec.table_config_to_proto(cfg), check_only=True)
    with Client(addresses) as client:
        checked = client._call_all("CreateTable", [check, check])
        assert "t" not in s0.shard.tables
        client.create_table(cfg)
        infos = client.describe_table("t")
    assert [i.row_floats for i in checked] == [i.row_floats for i in infos] == [s0.shard.table("t").width] * 2
    assert [i.spec for i in checked] == [i.spec for i in infos]
    assert [i.num_rows for i in checked] == [0, 0]


@pytest.mark.parametrize(
    "initializer, lr, params, refused",
    [
        (
            InitializerConfig("uniform", 1e9),
            1e-30,
            {},
            "reaches 1e\\+39 for initial embeddings \\|w\\| up to 1e\\+09 "
            "\\(uniform initializer: scale 1e\\+09; learning_rate 1e-30, params.beta 1, l2 0, l1 0\\)",
        ),
        (
            InitializerConfig("normal", 1e8),
            1e-30,
            {},
            "reaches 5.77e\\+38 for initial embeddings \\|w\\| up to "
            "5.77e\\+08 \\(normal initializer: 5.768 times scale 1e\\+08; learning_rate 1e-30, params.beta 1",
        ),
        (InitializerConfig("uniform", 1e9), 1.0, {"beta": 0.0, "l2": 1e30}, "reaches 1e\\+39 .* l2 1e\\+30, l1 0"),
        (InitializerConfig("uniform", 1e8), 1e-30, {}, None),  # z up to 1e38: finite
        (InitializerConfig("zeros"), 1e-30, {"beta": 1e30}, None),  # z = 0
    ],
)
def test_ftrl_whose_initial_z_overflows_float32_is_refused_for_a_new_table(
    two_shards, initializer, lr, params, refused
):
    """FTRL's initial z = -w (beta / lr + l2) - sign(w) l1: past float32's largest it is Inf, and every push to
    the row would be refused as an overflow. CreateTable refuses such a spec (INVALID_ARGUMENT, naming the options
    that combine) and creates nothing; one whose z stays finite is made, with finite z."""
    cfg = TableConfig("t", 4, initializer, optimizer=OptimizerConfig("ftrl", lr, params))
    addresses, (s0, s1) = two_shards()
    with Client(addresses) as client:
        if refused:
            with pytest.raises(
                PsError, match=f"table 't': ftrl's initial z = .*{refused}.* past float32's 3.4e\\+38"
            ) as e:
                client.create_table(cfg)
            assert e.value.status == "INVALID_ARGUMENT"
            assert not s0.shard.tables and not s1.shard.tables
            return
        client.create_table(cfg)
        ids = np.arange(1000, dtype=np.uint64)
        rows = client.pull("t", ids)
        client.push("t", ids, np.zeros((len(ids), 4), np.float32))  # refused as an overflow where a z is Inf
        after = client.pull("t", ids)
    assert np.isfinite(rows).all() and (rows != 0).any() == (initializer.name != "zeros")
    np.testing.assert_allclose(after, rows, rtol=1e-6)  # a zero gradient keeps z, and w = f(z) with it


@pytest.mark.parametrize("initializer", [InitializerConfig(), InitializerConfig("zeros")])
def test_ftrl_without_beta_and_l2_is_refused_for_a_new_table_only(tmp_path, two_shards, monkeypatch, initializer):
    """Such a table cannot hold its initial rows (a dim's first zero gradient sets it to 0, as below on a table
    made without the check), nor take a gradient whose square is 0 in float32, whatever its initializer: CreateTable
    refuses it (INVALID_ARGUMENT, naming the settings and what to change) and creates nothing; a data dir that
    holds one already still opens, and a CreateTable of its spec finds it."""
    cfg = TableConfig("t", 4, initializer, optimizer=FTRL_NO_BETA_L2)
    addresses, (s0, s1) = two_shards()
    with Client(addresses) as client:
        with pytest.raises(PsError, match=r"table 't': ftrl with beta 0 and l2 0 divides by \(beta \+ sqrt\(n\)\) / "
                                          r"learning_rate \+ l2, 0 at a dim .* cannot hold initial embeddings other "
                                          r"than 0, and a gradient of \|g\| <= 2.6e-23 would make the row non-finite; "
                                          r"give ftrl params.beta > 0 \(default 1\) or params.l2 > 0$") as e:  # fmt: skip
            client.create_table(cfg)
        assert e.value.status == "INVALID_ARGUMENT"
        assert not s0.shard.tables and not s1.shard.tables
    monkeypatch.setattr(tablemaker, "check_new", lambda cfg: None)  # a data dir made before the check
    old = Shard(ServerConfig(data_dir=str(tmp_path / "old")))
    old.create_table(cfg)
    ids = np.array([1, 2], np.uint64)
    initial = old.pull("t", ids)
    grads = np.array([[0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5]], np.float32)
    old.push("t", ids, grads)
    after = old.pull("t", ids)
    assert (initial != 0).all() == (initializer.name != "zeros") and (after[grads == 0] == 0).all()
    old.close()
    monkeypatch.undo()
    reopened = Shard(ServerConfig(data_dir=str(tmp_path / "old")))
    try:
        assert reopened.create_table(cfg) is reopened.table("t")
        np.testing.assert_array_equal(reopened.pull("t", ids), after)
    finally:
        reopened.close()


TOO_SMALL_FOR_NEW_TABLES = {  # a table option a data dir may hold (made before the rule) but a new table may not
    "ftrl l1": dict(optimizer=OptimizerConfig("ftrl", 0.05, {"l1": 1e-35})),
    "adam beta1": dict(optimizer=OptimizerConfig("adam", 0.001, {"beta1": 1e-35})),
    "weight_bound": dict(weight_bound=1e-35),
    "eviction decay": dict(eviction=EvictionConfig(decay=1e-35)),
    "admission probability": dict(admission=AdmissionConfig(probability=1e-17)),
}


@pytest.mark.parametrize("option", sorted(TOO_SMALL_FOR_NEW_TABLES))
def test_a_stored_table_with_an_option_a_new_table_may_not_have_opens_and_its_create_is_refused(tmp_path, option):
    """A shard's data dir whose stored config (Store.create_table, which checks nothing) has a value that check_new refuses
    opens in a Shard, which pulls from the table and finds it for a CreateTable of its spec; a shard without it
    refuses that CreateTable (INVALID_ARGUMENT, naming the option) and creates nothing."""
    cfg = TableConfig("t", 4, **TOO_SMALL_FOR_NEW_TABLES[option])
    Shard(ServerConfig(data_dir=str(tmp_path / "old"))).close()
    store = Store(str(tmp_path / "old"))
    try:
        store.create_table(cfg.normalized())
    finally:
        store.close()
    ids = np.array([1, 2], np.uint64)
    old = Shard(ServerConfig(data_dir=str(tmp_path / "old")))
    try:
        assert old.table("t").cfg == cfg.normalized() and old.pull("t", ids).shape == (2, 4)
        assert old.create_table(cfg) is old.table("t")
    finally:
        old.close()
    new = Shard(ServerConfig(data_dir=str(tmp_path / "new")))
    try:
        with pytest.raises(InvalidArgumentError, match=f"^table 't': {option} must be"):
            new.create_table(cfg)
        assert not new.tables
    finally:
        new.close()


def test_a_create_the_ram_tier_refuses_writes_nothing_and_takes_no_number(tmp_path):
    """A 4 MiB RAM tier holding 4 wide tables refuses a 5th (its Table joining the budget): no meta key of it is
    written (table/, tid/), the budget is as before, and a new table would take number 4, as if it never came; the
    data dir opened again holds the 4 tables alone."""
    shard = prepared(tmp_path, [(f"w{i}", WIDE, False) for i in range(4)])
    try:
        used = shard.budget.used_bytes
        with pytest.raises(RamTierTooSmallError, match="cannot take table number 5"):
            shard.create_table(TableConfig("t", WIDE))
        assert "t" not in shard.tables and shard.budget.used_bytes == used
        assert shard.store._dir.meta_cf.get(b"table/t") is None and shard.store._dir.meta_cf.get(b"tid/t") is None
        assert shard.store.number_for("n") == 4
    finally:
        shard.close()
    store = Store(str(tmp_path))
    try:
        assert sorted(cfg.name for cfg in store.load_tables()) == ["w0", "w1", "w2", "w3"]
        assert store._dir.meta_cf.get(b"table/t") is None and store._dir.meta_cf.get(b"tid/t") is None
    finally:
        store.close()


def test_a_stalled_log_line_of_a_made_table_stalls_no_request_waiting_for_the_shards_lock(tmp_path):
    """The shard logs a created (or replaced) table once it released its lock: while that line is stuck (a stalled
    stderr), a clock advance, which takes the lock, completes, and the create returns once the line is written."""
    import logging
    import threading

    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    writing, written = threading.Event(), threading.Event()

    class Stuck(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith(("created table", "replaced table")):
                writing.set()
                written.wait(60)

    logger = logging.getLogger("ps.engine.shard")
    handler, level = Stuck(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for clock, cfg in enumerate([TableConfig("t", 4), TableConfig("t", 8)], 1):  # made, then replaced
            writing.clear()
            written.clear()
            create = threading.Thread(target=shard.create_table, args=(cfg, True), daemon=True)
            create.start()
            assert writing.wait(30), "the create logged no line"
            advance = threading.Thread(target=shard.advance_clock, args=(1,), daemon=True)
            advance.start()
            advance.join(30)
            stuck = advance.is_alive()
            written.set()
            assert not stuck, "a clock advance waited for the create's log line"
            create.join(30)
            assert not create.is_alive() and shard.table("t").dim == cfg.dim and shard.clock == clock
    finally:
        written.set()
        logger.removeHandler(handler)
        logger.setLevel(level)
        shard.close()


def test_a_new_tables_create_deletes_a_stray_count_of_its_name_so_a_restart_counts_no_rows(tmp_path):
    """A readable count/t with no table t (no rows stored under any number of it): the create answers 0 rows, as its
    check does, and deletes the stray value, so the restarted shard's t holds 0 rows, untrained (replaced)."""
    shard = prepared(tmp_path, [], {b"count/t": STRAY_COUNTS})
    try:
        assert shard.check_create(TableConfig("t", 4))[1] == 0
        table = shard.create_table(TableConfig("t", 4))
        assert (table.num_rows, table.num_pending, table.trained) == (0, 0, False)
    finally:
        shard.close()
    shard = Shard(ServerConfig(data_dir=str(tmp_path), cache_bytes=SMALL_TIER))
    try:
        assert (shard.table("t").num_rows, shard.table("t").num_pending) == (0, 0)
        assert shard.create_table(TableConfig("t", 8), replace_untrained=True).dim == 8
    finally:
        shard.close()


def test_a_failed_replace_publishes_the_restored_table_only_once_it_counts_on_from_the_old_one(tmp_path, monkeypatch):
    """A replace whose config write fails puts a table of the old config back. Stats reads a table's counts without
    the shard lock, so that table must take the old one's counts (Table.count_on) before it is published under the
    name: the counts never go down."""
    from ps.engine.table import Table
    from ps.errors import StorageError

    shard = Shard(ServerConfig(data_dir=str(tmp_path), cache_bytes=SMALL_TIER, flush_interval_s=3600))
    try:
        shard.create_table(TableConfig("t", 4))
        shard.pull("t", np.arange(3, dtype=np.uint64))
        published_while_counting = []
        real_count_on = Table.count_on

        def count_on(self: Table, old: Table) -> None:
            published_while_counting.append(shard.tables.get("t") is self)
            real_count_on(self, old)

        def disk_full(*args: object) -> None:
            raise StorageError("disk full")

        monkeypatch.setattr(Table, "count_on", count_on)
        monkeypatch.setattr(shard.store, "create_table", disk_full)
        with pytest.raises(StorageError, match="disk full"):
            shard.create_table(TableConfig("t", 8), replace_untrained=True)
        assert published_while_counting == [False]
        assert shard.table("t").dim == 4 and shard.table("t").counters["pulls"] == 1
    finally:
        shard.close()
