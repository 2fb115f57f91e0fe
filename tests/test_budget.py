"""MemoryBudget and Arena: a table under its fair share takes rows back from tables above theirs, the rows given
back leave the arrays (which shrink), and a flush scan in progress still sees every dirty row that moved."""

from __future__ import annotations

import threading

import numpy as np

from ps.config import InitializerConfig, OptimizerConfig, ServerConfig, TableConfig
from ps.engine import table as table_module
from ps.engine.shard import Shard
from ps.rows.layout import layout_of
from ps.storage.arena import Arena, MemoryBudget
from tests.conftest import crash
from tests.waiting import join_thread, wait_until


def install(a: Arena, n: int, dirty: list[int]) -> np.ndarray:
    rows = a.grow(n, a.new_stamp())
    ids = np.arange(n, dtype=np.uint64) + np.uint64(100)
    a.install(rows, ids, np.ones((n, a.width), np.float32), np.zeros(n, np.uint64), np.zeros(n, np.uint8), 0)
    a.dirty[dirty] = 1
    return ids


def test_rows_given_back_are_clean_the_rest_move_and_a_flush_scan_still_sees_every_dirty_row():
    rc = Arena(1, MemoryBudget(1 << 20)).row_charge
    budget = MemoryBudget(16 * rc)
    a = Arena(1, budget)
    ids = install(a, 8, dirty=[5, 6, 7])
    first, stop = a.collect_dirty(0, 1)  # a flush takes row 5, then lets go of the lock
    assert first.tolist() == [5] and stop == 6
    a.dirty[5] = 0
    assert a.give_up(8) == 6 and a.used == 2  # only clean rows go: 6 of the 8
    assert a.capacity == 2 and len(a.data) == 2  # the arrays shrank with it
    assert a.index.lookup(ids).tolist() == [-1] * 6 + [0, 1]  # the dirty rows of ids 106 and 107 moved down
    rows, _ = a.collect_dirty(stop, 8)  # the scan goes on from row 6, and still finds both
    assert rows.tolist() == [0, 1] and a.ids[:2].tolist() == [106, 107]


def test_a_table_under_its_share_takes_rows_back_and_every_table_stays_within_the_budget():
    rc = Arena(1, MemoryBudget(1 << 20)).row_charge
    budget = MemoryBudget(12 * rc)
    big = Arena(1, budget)
    install(big, 12, dirty=[])  # the whole budget, while it is the only table
    small = Arena(1, budget)  # share: 6 rows each
    assert small.max_pinnable() == 3
    with small.lock:
        got = small.grow(5, small.new_stamp())
    assert len(got) == 5 and big.used == 7 and budget.used_bytes == 12 * rc
    assert big.data.nbytes <= budget.limit_bytes and small.data.nbytes <= budget.limit_bytes


def test_tables_pushed_at_once_under_a_tiny_budget_apply_every_push_exactly(tmp_path, monkeypatch):
    """Six tables share a RAM tier of 48 rows (8 each at the end, 60 ids each); each is pushed by its own thread,
    and each joins while the ones before it are being pushed (and hold more than the new share), while the flusher
    runs every 10 ms in chunks of 3 rows. Rows move between the tables (given back, dirty ones persisted first,
    the rest moved down, under flush scans in progress), and every push counts exactly, before and after a
    crash."""
    monkeypatch.setattr(table_module, "FLUSH_CHUNK_ROWS", 3)
    names = [f"t{k}" for k in range(6)]
    limit = 48 * layout_of(4, "sgd").ram_bytes
    config = ServerConfig(data_dir=str(tmp_path), cache_bytes=limit, flush_interval_s=0.01)
    shard = Shard(config)
    ids = np.arange(60, dtype=np.uint64) * np.uint64(1_000_003)
    counts = {name: np.zeros(len(ids)) for name in names}
    rounds = dict.fromkeys(names, 0)
    errors = []

    def pusher(name: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(40):
                pick = rng.choice(len(ids), 20, replace=False)
                shard.push(name, ids[pick], np.ones((20, 4), np.float32))
                counts[name][pick] += 1
                rounds[name] += 1
        except Exception as e:  # reported below
            errors.append(e)

    threads = []
    for k, name in enumerate(names):
        shard.create_table(TableConfig(name, 4, InitializerConfig("zeros"), OptimizerConfig("sgd", 1.0)))
        threads.append(threading.Thread(target=pusher, args=(name, k)))
        threads[-1].start()
        wait_until(lambda: rounds[name] >= 8 or errors, 60, f"8 pushes to {name}")  # noqa: B023 (waited on here)
    for t in threads:
        join_thread(t, 120, "a pushing thread")
    assert errors == []
    arenas = [shard.table(name).arena for name in names]
    assert sum(a.ram_bytes() for a in arenas) == shard.budget.used_bytes <= limit
    for name in names:
        np.testing.assert_array_equal(shard.pull(name, ids), np.repeat(-counts[name][:, None], 4, axis=1))
    crash(shard)  # what RocksDB and the journal hold must add up: a dirty row a flush missed would be lost
    shard = Shard(config)
    try:
        for name in names:
            np.testing.assert_array_equal(shard.pull(name, ids), np.repeat(-counts[name][:, None], 4, axis=1))
    finally:
        shard.close()
