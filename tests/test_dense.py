"""Dense parameters on the servers: every worker starts from the same initial values, gradients are summed
over --dense-sync-every steps and applied by the server's optimizer."""

from __future__ import annotations

import numpy as np

from ps.config import OptimizerConfig
from tests.inprocess import InProcessTables
from worker.dense import DenseSync, table_config, table_name
from worker.models.spec import ModelSpec, uniform_fields

SGD1 = OptimizerConfig("sgd", 1.0)


def _tables(spec, optimizer=SGD1):
    tables = InProcessTables(cache_bytes=64 << 20)
    for p in spec.dense_params():
        tables.create_table(table_config(p, optimizer))
    return tables


def test_initial_values_are_glorot_or_zero_and_the_same_for_every_worker():
    spec = ModelSpec("dnn", uniform_fields(3, 4), num_dense=2, hidden=(8, 8))
    with _tables(spec) as tables:
        a, b = DenseSync(tables, spec.dense_params()).pull(), DenseSync(tables, spec.dense_params()).pull()
        for p in spec.dense_params():
            np.testing.assert_array_equal(a[p.name], b[p.name])
            assert a[p.name].shape == p.shape
            if p.init == "zeros":
                assert (a[p.name] == 0).all()
            else:
                assert np.abs(a[p.name]).max() <= p.glorot_scale and a[p.name].std() > p.glorot_scale / 4
        assert not np.array_equal(a["mlp.1.weight"], a["mlp.0.weight"][:8])  # equal shapes, different values


def test_gradients_are_summed_and_pushed_every_k_steps():
    spec = ModelSpec("dnn", uniform_fields(1, 2), num_dense=0, hidden=(3,))
    with _tables(spec) as tables:
        dense = DenseSync(tables, spec.dense_params(), sync_every=3)
        start = {k: v.copy() for k, v in dense.pull().items()}
        ones = {p.name: np.ones(p.shape, np.float32) for p in spec.dense_params()}
        dense.step(ones)
        dense.step(ones)
        assert dense.syncs == 0 and all(np.array_equal(dense.values[k], start[k]) for k in start)
        dense.step(ones)  # third step: push the sum (3 per entry); SGD lr 1 subtracts it
        assert dense.syncs == 1
        for k in start:
            np.testing.assert_allclose(dense.values[k], start[k] - 3.0, rtol=1e-6)
            np.testing.assert_allclose(tables.pull(table_name(spec.dense_params()[0]), np.arange(2)).shape, (2, 3))
        dense.step(ones)
        dense.flush()  # a partial window is pushed at the end of training
        assert dense.syncs == 2
        for k in start:
            np.testing.assert_allclose(dense.values[k], start[k] - 4.0, rtol=1e-6)
