"""adagrad_rowwise (one accumulator per row: a += mean_j g_j^2; w -= lr g / (sqrt(a) + eps)) against a float64
numpy oracle: the kernel alone, pushes through a Shard whose RAM tier holds a few rows (evicted rows come back
from RocksDB with their accumulator), a restart and a checkpoint restore, GEO's local step, its layout and size
(smaller than adagrad's), and its configuration (validation, TOML)."""

from __future__ import annotations

import numpy as np
import pytest

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.errors import InvalidArgumentError
from ps.rows import update
from ps.rows.initializers import init_rows
from ps.rows.layout import STATS_FLOATS, layout_of
from ps.rows.optim import ADAGRAD_ROWWISE, get_optimizer
from ps.server_config import ServerConfig
from ps.sizing import size_report
from ps.storage.budget import min_share_bytes
from ps.table_toml import table_configs_from_toml
from tests.conftest import one_shard_checkpoint
from tests.inprocess import InProcessTables
from worker.geo import GeoTables

F32 = np.float32
DIM = 5
LR, ACC0, EPS = 0.1, 0.3, 1e-6
CFG = TableConfig(
    "rw", DIM, InitializerConfig("uniform", 0.3, seed=7),
    OptimizerConfig("adagrad_rowwise", LR, {"initial_accumulator": ACC0, "epsilon": EPS}),
)  # fmt: skip
TINY_RAM_TIER = min_share_bytes(layout_of(DIM, "adagrad_rowwise").ram_bytes)  # the least a table may get (256 rows)


class Oracle:
    """Rows of ids as a float64 dict id -> (w, a); an id's row starts at its initial embedding and ACC0 at its
    first push."""

    def __init__(self, cfg: TableConfig = CFG):
        self.cfg, self.rows = cfg, {}

    def initial(self, i: int) -> np.ndarray:
        w = np.empty((1, self.cfg.dim), F32)
        init_rows(self.cfg.initializer, np.array([i], np.uint64), w, self.cfg.dim)
        return w[0].astype(np.float64)

    def step(self, ids: np.ndarray, grads: np.ndarray) -> None:
        for i, g in zip(ids.tolist(), grads.astype(np.float64)):
            w, a = self.rows.get(i, (self.initial(i), ACC0))
            a = a + float(np.mean(g * g))
            self.rows[i] = (w - LR * g / (np.sqrt(a) + EPS), a)

    def full(self, ids: np.ndarray) -> np.ndarray:
        """(n, dim + 1): embedding, accumulator."""
        return np.array([[*self.rows[i][0], self.rows[i][1]] for i in ids.tolist()])


def pushes(seed: int, n: int, pool: int = 40, per_push: int = 12) -> list[tuple[np.ndarray, np.ndarray]]:
    """(unique ids, grads) per push; push k draws from ids 1..pool (k + 1) / n, so later pushes bring ids never
    pushed before."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        ids = np.unique(rng.integers(1, 2 + pool * (k + 1) // n, per_push).astype(np.uint64))
        out.append((ids, (rng.standard_normal((len(ids), DIM)) * rng.uniform(0.1, 3)).astype(F32)))
    return out


def test_kernel_matches_the_oracle_over_steps_with_rows_initialized_lazily():
    opt = get_optimizer(CFG.optimizer)
    assert opt.state_floats(DIM) == 1
    rng = np.random.default_rng(0)
    rows = np.zeros((30, DIM + 1), F32)
    want = np.zeros((30, DIM + 1))
    started = np.zeros(30, bool)
    for step in range(6):
        touched = np.flatnonzero(rng.random(30) < 0.5)
        fresh = touched[~started[touched]]  # rows first touched now get the initial state, as the table does
        block = np.zeros((len(fresh), DIM + 1), F32)
        block[:, :DIM] = rng.standard_normal((len(fresh), DIM))
        opt.init_state(block, DIM)
        rows[fresh] = block
        assert (rows[fresh, DIM] == F32(ACC0)).all()
        want[fresh] = rows[fresh]
        started[fresh] = True
        grads = (rng.standard_normal((len(touched), DIM)) * (step + 1)).astype(F32)
        buf = np.ascontiguousarray(rows[touched])
        opt.apply(buf, grads)
        rows[touched] = buf
        for i, g in zip(touched, grads.astype(np.float64)):
            a = want[i, DIM] + np.mean(g * g)
            want[i, :DIM] -= LR * g / (np.sqrt(a) + EPS)
            want[i, DIM] = a
    assert started.sum() > 20
    np.testing.assert_allclose(rows, want, rtol=2e-5, atol=1e-6)
    untouched = ~started
    assert (rows[untouched] == 0).all()


def test_one_step_size_per_row_unlike_adagrad():
    rw, ada = get_optimizer(CFG.optimizer), get_optimizer(OptimizerConfig("adagrad", LR, {"epsilon": EPS}))
    grads = np.array([[1.0, 0.0, 0.0, 0.0, 2.0]], F32)
    a = np.zeros((1, DIM + 1), F32)
    rw.init_state(a, DIM)
    rw.apply(a, grads)
    b = np.zeros((1, 2 * DIM), F32)
    ada.init_state(b, DIM)
    ada.apply(b, grads)
    assert a[0, DIM] == pytest.approx(ACC0 + 1.0)  # (1 + 0 + 0 + 0 + 4) / 5
    assert a[0, 4] == pytest.approx(2 * a[0, 0])  # the same step size for every dim of the row
    assert b[0, 4] != pytest.approx(2 * b[0, 0])


def test_hyper_params_name_it():
    hp = update.hyper_params(get_optimizer(CFG.optimizer), CFG.admission, 0.0)
    assert hp[update.OPTIMIZER] == ADAGRAD_ROWWISE
    assert update.describe(hp)["optimizer"] == "adagrad_rowwise"


def test_pushes_through_a_shard_with_a_tiny_ram_tier_match_the_oracle_then_survive_a_restart(tmp_path):
    config = ServerConfig(data_dir=str(tmp_path / "d"), cache_bytes=TINY_RAM_TIER, flush_interval_s=3600)
    oracle = Oracle()
    shard = Shard(config)
    try:
        shard.create_table(CFG)
        for ids, grads in pushes(1, 10, pool=1000, per_push=400):
            shard.push("rw", ids, grads)
            oracle.step(ids, grads)
        ids = np.array(sorted(oracle.rows), np.uint64)
        assert len(ids) > 600 and shard.table("rw").stats()["evictions"] > 0  # rows went to RocksDB and came back
        table = shard.table("rw")
        assert table.width == DIM + 1 + STATS_FLOATS
        np.testing.assert_allclose(table.peek(ids)[:, : DIM + 1], oracle.full(ids), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(shard.pull("rw", ids), oracle.full(ids)[:, :DIM], rtol=1e-4, atol=1e-6)
    finally:
        shard.close()
    reopened = Shard(config)
    try:
        for ids, grads in pushes(2, 3, pool=1000, per_push=400):  # the accumulators came back: the oracle's steps
            reopened.push("rw", ids, grads)
            oracle.step(ids, grads)
        ids = np.array(sorted(oracle.rows), np.uint64)
        np.testing.assert_allclose(reopened.table("rw").peek(ids)[:, : DIM + 1], oracle.full(ids), rtol=1e-4, atol=1e-6)
    finally:
        reopened.close()


def test_a_checkpoint_restores_the_rows_and_their_accumulators(tmp_path):
    oracle = Oracle()
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        shard.create_table(CFG)
        for ids, grads in pushes(3, 8):
            shard.push("rw", ids, grads)
            oracle.step(ids, grads)
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), [CFG])
    finally:
        shard.close()
    restored = Shard(ServerConfig(data_dir=str(tmp_path / "copy"), restore_dir=str(tmp_path / "ckpt")))
    try:
        ids = np.array(sorted(oracle.rows), np.uint64)
        table = restored.table("rw")
        np.testing.assert_allclose(table.peek(ids)[:, : DIM + 1], oracle.full(ids), rtol=1e-4, atol=1e-6)
        for ids, grads in pushes(4, 3):
            restored.push("rw", ids, grads)
            oracle.step(ids, grads)
        ids = np.array(sorted(oracle.rows), np.uint64)
        np.testing.assert_allclose(table.peek(ids)[:, : DIM + 1], oracle.full(ids), rtol=1e-4, atol=1e-6)
    finally:
        restored.close()


def test_geo_local_steps_match_the_oracle_and_the_servers_add_the_deltas():
    server = InProcessTables(cache_bytes=64 << 20)
    try:
        server.create_table(CFG)
        geo = GeoTables(server, {"rw": CFG}, every=3)
        oracle = Oracle()
        steps = pushes(5, 9)
        for ids, grads in steps:
            geo.rows({"rw": ids})
            geo.apply("rw", ids, grads, np.ones(len(ids), F32), np.zeros(len(ids), F32))
            geo.end_step()
            oracle.step(ids, grads)  # one worker: its local rows are the rows a server optimizer would hold
        geo.flush()
        ids = np.array(sorted(oracle.rows), np.uint64)
        np.testing.assert_allclose(server.pull("rw", ids), oracle.full(ids)[:, :DIM], rtol=1e-4, atol=1e-6)
        table = server.shard.table("rw")
        assert (table.peek(ids)[:, DIM] == F32(ACC0)).all()  # deltas added without the servers' optimizer
    finally:
        server.close()


@pytest.mark.parametrize("dim", [3, 8, 16, 64])  # at dim 2 the arena's padding to an even float count evens them
def test_a_row_is_dim_plus_one_plus_stats_floats_and_smaller_than_adagrads(dim):
    rw, ada = layout_of(dim, "adagrad_rowwise"), layout_of(dim, "adagrad")
    assert rw.state_floats == 1 and rw.width == dim + 1 + STATS_FLOATS
    assert rw.ram_bytes < ada.ram_bytes and rw.disk_bytes < ada.disk_bytes
    assert ada.value_bytes - rw.value_bytes == 4 * (dim - 1)
    report = size_report(10**6, dim, "adagrad_rowwise", 2, 0.1)
    assert report["floats_per_row"] == rw.width and report["ram_bytes_per_row"] == rw.ram_bytes
    assert report["disk_bytes_per_row"] < size_report(10**6, dim, "adagrad", 2, 0.1)["disk_bytes_per_row"]


def test_bytes_per_row_at_dim_16():
    rw, ada = layout_of(16, "adagrad_rowwise"), layout_of(16, "adagrad")
    assert (rw.ram_bytes, ada.ram_bytes) == (4 * (22 + 6) + 84, 4 * (36 + 6) + 84) == (196, 252)
    assert (rw.disk_bytes, ada.disk_bytes) == (14 + 4 * 21 + 8 + 8, 14 + 4 * 36 + 8 + 8) == (114, 174)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"initial_accumulator": -1.0}, "adagrad_rowwise initial_accumulator must be finite, >= 0"),
        ({"epsilon": 0.0}, "adagrad_rowwise epsilon must be finite, >= 1e-30"),
        ({"beta1": 0.9}, r"unknown parameters \[.beta1.\]"),
    ],
)
def test_bad_parameters_are_rejected(params, message):
    with pytest.raises(InvalidArgumentError, match=message):
        get_optimizer(OptimizerConfig("adagrad_rowwise", 0.1, params))


def test_a_table_config_file_chooses_it_with_adagrads_defaults():
    fields = table_configs_from_toml('[fm]\noptimizer = { name = "adagrad_rowwise", learning_rate = 0.02 }\n')
    cfg = TableConfig(dim=8, **fields["fm"])
    cfg.validate()
    assert cfg.optimizer.normalized().params == {"epsilon": 1e-7, "initial_accumulator": 0.1}
