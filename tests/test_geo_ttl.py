"""How old a row that one geo worker trains every step looks to its shard (the clock less the row's last_step, which
a Shrink's TTL reads: ps.engine.shrinkrule), against worker.model_tables.geo_ttl_bound, on in-process servers with
several GeoTables workers stepping in a set order; a Shrink at the bound; and the warning a geo job's start gives
for a sparse table whose ttl_steps is under GEO_TTL_MARGIN times the bound (warn_of_geo_ttl)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ps.config import EvictionConfig, OptimizerConfig, TableConfig
from ps.rows.layout import LAST_STEP
from tests.inprocess import InProcessTables
from worker.geo import GeoTables
from worker.job import check_training
from worker.model_tables import GEO_TTL_MARGIN, geo_ttl_bound
from worker.train_config import TrainConfig

F32 = np.float32
HOT = 7  # the id worker 0 trains at every one of its steps


@pytest.fixture
def server():
    tables = InProcessTables(cache_bytes=64 << 20)
    yield tables
    tables.close()


def make_workers(server: InProcessTables, configs: dict[str, TableConfig], num_workers: int, every: int) -> list:
    for cfg in configs.values():
        server.create_table(cfg)
    return [GeoTables(server, configs, every, num_workers=num_workers) for _ in range(num_workers)]


def step(worker: int, geo: GeoTables, tables: list[str]) -> None:
    """One step of `worker`: worker 0 trains HOT, worker w id 100 + w, in every table."""
    ids = np.array([HOT if worker == 0 else 100 + worker], np.uint64)
    geo.rows(dict.fromkeys(tables, ids))
    for t in tables:
        geo.apply(t, ids, np.full((1, 4), 0.01, F32), np.ones(1, F32), np.zeros(1, F32))
    geo.end_step()


def hot_age(server: InProcessTables, table: str) -> int:
    t = server.shard.table(table)
    return server.shard.clock - int(t.peek(np.array([HOT], np.uint64))[0, t.stats_col + LAST_STEP])


def largest_hot_age(num_workers: int, every: int, pace: int, rounds: int) -> int:
    """Trains num_workers geo workers pushing every `every` steps, each round worker 0 taking one step and every
    other `pace` steps, in turn; the largest age of HOT on the shard after any step once worker 0 pushed it."""
    with InProcessTables(cache_bytes=64 << 20) as server:
        cfg = TableConfig("emb", 4, optimizer=OptimizerConfig("sgd", 0.5))
        workers = make_workers(server, {"emb": cfg}, num_workers, every)
        largest = 0
        for _ in range(rounds):
            for w, geo in enumerate(workers):
                for _ in range(1 if w == 0 else pace):
                    step(w, geo, ["emb"])
                    if workers[0].pushes:
                        largest = max(largest, hot_age(server, "emb"))
        return largest


@pytest.mark.parametrize("num_workers, every", [(1, 4), (3, 1), (3, 4), (4, 5)])
def test_a_row_one_worker_trains_every_step_is_at_most_num_workers_x_geo_every_old_the_workers_in_lock_step(
    num_workers, every
):
    """Each push stamps the row with the clock before its own advance, and by that worker's next push every worker
    advanced the clock by `every`: the age reaches num_workers x every, no more (every 1: an async job's N)."""
    assert largest_hot_age(num_workers, every, pace=1, rounds=6 * every) == geo_ttl_bound(num_workers, every)


@pytest.mark.parametrize("num_workers, every", [(2, 3), (3, 4)])
def test_a_worker_at_half_its_peers_pace_sees_its_row_reach_2n_less_1_times_geo_every_under_the_margin(
    num_workers, every
):
    """The others take 2 steps to worker 0's 1: (2N - 1) x every, past the lock-step bound and under
    GEO_TTL_MARGIN times it, the ttl_steps the start's warning asks for."""
    largest = largest_hot_age(num_workers, every, pace=2, rounds=6 * every)
    assert largest == (2 * num_workers - 1) * every
    assert geo_ttl_bound(num_workers, every) < largest < GEO_TTL_MARGIN * geo_ttl_bound(num_workers, every)


def test_a_shrink_at_the_bound_drops_the_trained_row_under_a_ttl_of_the_bound_less_1_and_keeps_it_at_the_bound(
    server,
):
    """3 workers pushing every 4 steps in lock-step, a Shrink just before worker 0's second push (its row then 12
    steps old): the table of ttl_steps 11 loses HOT, which worker 0 trained at every step; that of 12 keeps it."""
    n, every = 3, 4
    bound = geo_ttl_bound(n, every)
    sgd = OptimizerConfig("sgd", 0.5)
    configs = {
        "tight": TableConfig("tight", 4, optimizer=sgd, eviction=EvictionConfig(ttl_steps=bound - 1)),
        "safe": TableConfig("safe", 4, optimizer=sgd, eviction=EvictionConfig(ttl_steps=bound)),
    }
    workers = make_workers(server, configs, n, every)
    for _ in range(2 * every - 1):  # worker 0 pushed at its step `every`; its next push is at step 2 x every
        for w, geo in enumerate(workers):
            step(w, geo, list(configs))
    assert workers[0].pushes == 1 and hot_age(server, "tight") == hot_age(server, "safe") == bound
    assert server.shard.shrink("tight")["dropped"] == 1  # HOT alone: the others pushed after it
    assert server.shard.shrink("safe")["dropped"] == 0
    initial = TableConfig("fresh", 4, optimizer=sgd)
    server.create_table(initial)
    hot = np.array([HOT], np.uint64)
    np.testing.assert_array_equal(server.pull("tight", hot), server.pull("fresh", hot))  # back at its initial row
    assert not np.array_equal(server.pull("safe", hot), server.pull("fresh", hot))  # trained, kept


def geo_config(tmp_path, ttl_steps: int, **flags) -> TrainConfig:
    sets = tmp_path / "sets.toml"
    sets.write_text(f"[fm]\neviction = {{ ttl_steps = {ttl_steps} }}\n")
    return TrainConfig(servers=("127.0.0.1:1",), mode="geo", synthetic_rows=1000, synthetic_eval_rows=100,
                       timeout_s=1.0, server_timeout_s=0, table_config=str(sets), job_id="ttl", **flags)  # fmt: skip


def test_a_geo_jobs_start_warns_once_of_a_ttl_under_the_margin_naming_the_table_and_what_to_change(tmp_path, caplog):
    """3 workers, --geo-every 4: bound 12, margin 24. ttl_steps 20 is warned of (before any server is touched:
    the servers' address is nowhere), once, with the table, its ttl, the bound and the fixes; 24 is not, nor a
    worker other than 0, nor a check_training told not to warn, nor an async job."""
    cfg = geo_config(tmp_path, 20, num_workers=3, geo_every=4)
    with caplog.at_level("WARNING"):
        check_training(cfg)
    warned = [r.getMessage() for r in caplog.records if "(--geo-every)" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "3 workers pushing every 4 steps" in warned[0] and "12 clock steps old" in warned[0]
    assert "table(s) fm (ttl_steps 20) may lose, where paces differ, rows" in warned[0]  # 12 <= 20 < 24
    assert "raise their ttl_steps to 24 or more" in warned[0] and "lower --geo-every to 3 or less" in warned[0]
    quiet = [
        geo_config(tmp_path, 24, num_workers=3, geo_every=4),
        geo_config(tmp_path, 0, num_workers=3, geo_every=4),  # no TTL
        dataclasses.replace(cfg, worker_id=1),
        dataclasses.replace(cfg, mode="async", geo_every=None),
    ]
    for other in quiet:
        caplog.clear()
        with caplog.at_level("WARNING"):
            check_training(other)
        assert "(--geo-every)" not in caplog.text, other
    caplog.clear()
    with caplog.at_level("WARNING"):
        check_training(cfg, warn=False)
    assert "(--geo-every)" not in caplog.text


def test_a_ttl_too_short_for_geo_every_1_suggests_only_raising_it(tmp_path, caplog):
    """ttl_steps 5 with 3 workers: even --geo-every 1 needs 6, so the warning does not offer a lower --geo-every."""
    with caplog.at_level("WARNING"):
        check_training(geo_config(tmp_path, 5, num_workers=3, geo_every=2))
    assert (
        "table(s) fm (ttl_steps 5) would lose rows" in caplog.text
    )  # under the bound, 6 and "raise their ttl_steps to 12 or more" in caplog.text
    assert "lower --geo-every" not in caplog.text
