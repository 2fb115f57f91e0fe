"""Table against a trivial in-memory model under random pull / push / restart sequences."""

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.errors import InvalidArgumentError
from ps.initializers import init_rows
from ps.store import Store
from ps.table import Table

CFG = TableConfig("t", 3, InitializerConfig("uniform", 0.5, seed=9), OptimizerConfig("sgd", 1.0))
ID_POOL = [0, 1, 2, 255, 256, 2**32, 2**63, 2**64 - 2, 2**64 - 1] + list(range(1000, 1020))
ids_strategy = st.lists(st.sampled_from(ID_POOL), min_size=0, max_size=15)


def initial(ids):
    out = np.empty((len(ids), 3), dtype=np.float32)
    init_rows(CFG.initializer, np.array(ids, dtype=np.uint64), out, 3)
    return out


class TableModel(RuleBasedStateMachine):
    """The model: a dict id -> row; a missing id reads as its initial value. SGD lr=1: row -= grad."""

    def __init__(self):
        super().__init__()
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="table-sm-")
        self.model: dict[int, np.ndarray] = {}

    @initialize()
    def open(self):
        self.store = Store(self.dir)
        self.store.create_table(CFG)
        self.table = Table(CFG, self.store, capacity=2)

    def expected(self, ids):
        init = initial(ids)
        return np.array([self.model.get(i, init[k]) for k, i in enumerate(ids)], dtype=np.float32).reshape(-1, 3)

    @rule(ids=ids_strategy)
    def pull(self, ids):
        got = self.table.pull(np.array(ids, dtype=np.uint64))
        np.testing.assert_array_equal(got, self.expected(ids))

    @rule(ids=st.lists(st.sampled_from(ID_POOL), unique=True, max_size=10), seed=st.integers(0, 1000))
    def push(self, ids, seed):
        grads = np.random.default_rng(seed).integers(-4, 5, (len(ids), 3)).astype(np.float32)
        before = self.expected(ids)
        self.table.push(np.array(ids, dtype=np.uint64), grads)
        for k, i in enumerate(ids):
            self.model[i] = before[k] - grads[k]

    @precondition(lambda self: len(self.model) > 0)
    @rule(ids=st.lists(st.sampled_from(ID_POOL), min_size=1, max_size=5), data=st.data())
    def push_with_duplicates_changes_nothing(self, ids, data):
        ids = ids + [data.draw(st.sampled_from(ids))]
        with pytest.raises(InvalidArgumentError, match="repeats id"):
            self.table.push(np.array(ids, dtype=np.uint64), np.ones((len(ids), 3), dtype=np.float32))

    @rule()
    def restart(self):
        self.store.close()
        self.open()

    @invariant()
    def row_count_is_exact(self):
        if hasattr(self, "table"):
            assert self.table.num_stored == len(self.model)

    def teardown(self):
        self.store.close()


TestTableModel = TableModel.TestCase
TestTableModel.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)


def test_adagrad_state_persists_across_restart(tmp_path):
    cfg = TableConfig("a", 2, optimizer=OptimizerConfig("adagrad", 0.1, {"initial_accumulator": 1.0}))
    store = Store(str(tmp_path))
    store.create_table(cfg)
    t = Table(cfg, store)
    ids = np.array([7, 8], dtype=np.uint64)
    t.push(ids, np.full((2, 2), 2.0, dtype=np.float32))
    before = t.peek(ids)
    np.testing.assert_allclose(before[:, 2:], 5.0)  # 1 + 2^2
    store.close()
    store = Store(str(tmp_path))
    t = Table(cfg, store)
    np.testing.assert_array_equal(t.peek(ids), before)
    store.close()
