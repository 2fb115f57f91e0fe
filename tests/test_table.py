"""Table against a trivial in-memory model under random pull / push / flush / restart / crash sequences,
with a RAM tier so small that eviction happens all the time."""

import os
import shutil
import tempfile
from unittest import mock

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ps.config import InitializerConfig, OptimizerConfig, ServerConfig, TableConfig
from ps.engine.shard import Shard
from ps.errors import InvalidArgumentError
from ps.rows.initializers import init_rows
from ps.rows.layout import layout_of
from ps.storage import budget as budget_module
from ps.storage import journal as journal_module
from tests.conftest import crash

CFG = TableConfig("t", 3, InitializerConfig("uniform", 0.5, seed=9), OptimizerConfig("sgd", 1.0))
ID_POOL = [0, 1, 2, 255, 256, 2**32, 2**63, 2**64 - 2, 2**64 - 1] + list(range(1000, 1030))
ids_strategy = st.lists(st.sampled_from(ID_POOL), min_size=0, max_size=15)


def initial(ids):
    out = np.empty((len(ids), 3), dtype=np.float32)
    init_rows(CFG.initializer, np.array(ids, dtype=np.uint64), out, 3)
    return out


TINY_RAM_TIER = 8 * layout_of(3, "sgd").ram_bytes  # 8 rows: requests of up to 15 ids are chunked, much is evicted


@pytest.fixture(autouse=True)
def tiny_shares(monkeypatch):
    """A RAM tier of 8 rows holds a table: a share may be one row here (MIN_SHARE_ROWS rows otherwise)."""
    monkeypatch.setattr(budget_module, "MIN_SHARE_ROWS", 1)


class TableModel(RuleBasedStateMachine):
    """The model: a dict id -> row; a missing id reads as its initial value. SGD lr=1: row -= grad.
    The shard runs with a RAM tier of 8 rows and a flusher that never fires on its own."""

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="table-sm-")
        self.model: dict[int, np.ndarray] = {}

    @initialize()
    def open(self):
        self.shard = Shard(ServerConfig(data_dir=self.dir, cache_bytes=TINY_RAM_TIER, flush_interval_s=3600))
        self.table = self.shard.create_table(CFG)

    def expected(self, ids):
        init = initial(ids)
        return np.array([self.model.get(i, init[k]) for k, i in enumerate(ids)], dtype=np.float32).reshape(-1, 3)

    @rule(ids=ids_strategy)
    def pull(self, ids):
        got = self.shard.pull("t", np.array(ids, dtype=np.uint64))
        np.testing.assert_array_equal(got, self.expected(ids))

    @rule(ids=st.lists(st.sampled_from(ID_POOL), unique=True, max_size=12), seed=st.integers(0, 1000))
    def push(self, ids, seed):
        grads = np.random.default_rng(seed).integers(-4, 5, (len(ids), 3)).astype(np.float32)
        before = self.expected(ids)
        self.shard.push("t", np.array(ids, dtype=np.uint64), grads)
        for k, i in enumerate(ids):
            self.model[i] = before[k] - grads[k]

    @precondition(lambda self: len(self.model) > 0)
    @rule(ids=st.lists(st.sampled_from(ID_POOL), min_size=1, max_size=6), data=st.data())
    def push_with_duplicates_changes_nothing(self, ids, data):
        ids = ids + [data.draw(st.sampled_from(ids))]
        with pytest.raises(InvalidArgumentError, match="repeats id"):
            self.shard.push("t", np.array(ids, dtype=np.uint64), np.ones((len(ids), 3), dtype=np.float32))

    @rule(ids=st.lists(st.sampled_from(ID_POOL), unique=True, min_size=1, max_size=12))
    def push_whose_journal_write_fails_changes_nothing(self, ids):
        journal = self.shard.journal

        def disk_full(fd, parts, offset):  # the first 10 bytes of the record reach the file, then the disk is full
            return os.pwrite(fd, bytes(parts[0])[:10], offset)

        # the write path a full disk can fail: pwritev (space the journal has prepared is written by memory copy)
        no_prepared_space = mock.patch.object(
            type(journal._prefault), "mapped_end", new_callable=mock.PropertyMock, return_value=0
        )
        with (
            no_prepared_space,
            mock.patch.object(journal_module.os, "pwritev", disk_full),
            pytest.raises(OSError, match="journal write of .* bytes wrote 10"),
        ):
            self.shard.push("t", np.array(ids, dtype=np.uint64), np.ones((len(ids), 3), dtype=np.float32))
        assert os.path.getsize(journal._path) == journal._segment_size  # the partial record was cut off

    @rule()
    def flush(self):
        self.shard.flush()

    @rule()
    def clean_restart(self):
        self.shard.close()
        self.open()

    @rule()
    def crash(self):
        crash(self.shard)
        self.open()

    @invariant()
    def row_count_and_memory_are_exact(self):
        if hasattr(self, "table"):
            assert self.table.num_rows == len(self.model)
            assert self.table.arena.used <= 8 and len(self.table.arena.index) == self.table.arena.used

    def teardown(self):
        self.shard.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestTableModel = TableModel.TestCase
TestTableModel.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


def test_adagrad_state_survives_flush_and_restart(tmp_path):
    cfg = TableConfig("a", 2, optimizer=OptimizerConfig("adagrad", 0.1, {"initial_accumulator": 1.0}))
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    shard.create_table(cfg)
    ids = np.array([7, 8], dtype=np.uint64)
    shard.push("a", ids, np.full((2, 2), 2.0, dtype=np.float32))
    before = shard.table("a").peek(ids)
    np.testing.assert_allclose(before[:, 2:4], 5.0)  # 1 + 2^2
    np.testing.assert_array_equal(before[:, 4:], [[1, 0, 0, 1]] * 2)  # show, click, last step, admitted
    shard.close()
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    np.testing.assert_array_equal(shard.table("a").peek(ids), before)
    assert shard.table("a").stored_counts == {"admitted": 2, "pending": 0} and shard.journal.size_bytes() == 0
    shard.close()


def test_a_pull_of_int64_ids_finds_the_rows_pushed_under_their_uint64_values(tmp_path):
    """The compiled index compares uint64 keys: a pull of int64 ids (an in-process caller's) is taken as uint64,
    as a push is, not missed and given an initial row that would hide the pushed one."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d"), flush_interval_s=3600))
    try:
        shard.create_table(TableConfig("t", 2, InitializerConfig("zeros", 0.0, seed=1), OptimizerConfig("sgd", 1.0)))
        ids = np.array([5, 2**40 + 3], dtype=np.uint64)
        shard.push("t", ids, np.full((2, 2), -1.0, np.float32))
        for pulled in (ids.astype(np.int64), ids):
            np.testing.assert_array_equal(shard.pull("t", pulled), np.ones((2, 2), np.float32))
    finally:
        shard.close()
