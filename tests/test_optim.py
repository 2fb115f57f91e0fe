import numpy as np
import pytest

from ps.config import ADAM_BETA_MAX, DEFAULT_LEARNING_RATES, OPTIMIZER_PARAMS, OptimizerConfig
from ps.errors import InvalidArgumentError
from ps.rows.optim import OPTIMIZERS, get_optimizer


def _rows(n, width, seed=0):
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


def test_every_optimizer_has_an_update_rule_its_parameters_and_a_default_rate():
    """The three registries name the same optimizers: one added to only one would be refused or rejected elsewhere
    (ps-worker train --optimizer takes its choices from OPTIMIZER_PARAMS)."""
    assert set(OPTIMIZERS) == set(OPTIMIZER_PARAMS) == set(DEFAULT_LEARNING_RATES)
    for name, rule in OPTIMIZERS.items():
        assert set(rule.KERNEL_PARAMS) <= set(OPTIMIZER_PARAMS[name]), name


def test_sgd_matches_reference():
    opt = get_optimizer(OptimizerConfig("sgd", 0.3))
    rows, grads = _rows(50, 6), _rows(50, 6, 1)
    want = rows - np.float32(0.3) * grads
    opt.apply(rows, grads)
    np.testing.assert_allclose(rows, want, rtol=1e-6)


def test_adagrad_matches_per_element_reference_loop():
    opt = get_optimizer(OptimizerConfig("adagrad", 0.1, {"initial_accumulator": 0.5, "epsilon": 1e-6}))
    dim = 5
    assert opt.state_floats(dim) == dim
    rows = _rows(40, 2 * dim)
    opt.init_state(rows, dim)
    assert (rows[:, dim:] == 0.5).all()
    want = rows.astype(np.float64)
    for step in range(3):
        grads = _rows(40, dim, step + 1)
        for i in range(40):
            for j in range(dim):
                g = float(grads[i, j])
                want[i, dim + j] += g * g
                want[i, j] -= 0.1 * g / (np.sqrt(want[i, dim + j]) + 1e-6)
        opt.apply(rows, grads)
    np.testing.assert_allclose(rows, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "cfg, message",
    [
        (OptimizerConfig("lamb"), "optimizer 'lamb' is unknown"),
        (OptimizerConfig("adam", 0.1, {"beta1": 1.0}), r"beta1 must be in \[0, 1\)"),
        (OptimizerConfig("ftrl", 0.1, {"l1": -1.0}), "ftrl l1 must be finite, >= 0"),
        (OptimizerConfig("adagrad", 0.1, {"beta1": 0.9}), r"unknown parameters \[.beta1.\]"),
        (OptimizerConfig("adagrad", 0.1, {"initial_accumulator": -1}), "initial_accumulator must be finite, >= 0"),
        (OptimizerConfig("adagrad", 0.1, {"epsilon": 0.0}), "epsilon must be finite, >= 1e-30"),
        (OptimizerConfig("adagrad", 0.1, {"epsilon": float("nan")}), "epsilon must be finite"),
        (OptimizerConfig("adagrad", 0.1, {"initial_accumulator": 1e39}), "<= 1e\\+30, got 1e\\+39"),
        (OptimizerConfig("sgd", 0.1, {"x": 1.0}), "unknown parameters"),
        # values that pass in float64 but not in the kernels' float32: 1 - beta ** t would be 0, epsilon 0
        (OptimizerConfig("adam", 0.1, {"beta2": 0.99999999}), r"beta2 must be in \[0, 1\) and below 1 in float32"),
        (OptimizerConfig("adam", 0.1, {"epsilon": 1e-50}), "adam epsilon must be finite, >= 1e-30"),
        (OptimizerConfig("ftrl", 1e-50), "learning_rate must be finite, >= 1e-30"),
        (OptimizerConfig("adagrad", 0.1, {"epsilon": 1e-40, "initial_accumulator": 0.0}), "epsilon must be finite"),
    ],
)
def test_bad_optimizer_configs_are_rejected(cfg, message):
    with pytest.raises(InvalidArgumentError, match=message):
        get_optimizer(cfg)


@pytest.mark.parametrize("lr", [0.0, -1.0, float("inf"), 1e39])
def test_bad_learning_rates_are_rejected(lr):
    with pytest.raises(InvalidArgumentError, match="learning_rate must be finite, >= 1e-30"):
        OptimizerConfig("sgd", lr).validate()


def test_the_smallest_values_taken_keep_every_kernel_finite_on_zero_gradients():
    """At the limits validation takes, a zero gradient on a fresh row (zero accumulators) divides by epsilon or
    by 1 - beta ** t at their smallest: every result stays finite (the kernels never raise: numpy's error model)."""
    smallest = {
        "sgd": {},
        "adagrad": {"epsilon": 1e-30, "initial_accumulator": 0.0},
        "adagrad_rowwise": {"epsilon": 1e-30, "initial_accumulator": 0.0},
        "adam": {"beta1": ADAM_BETA_MAX, "beta2": ADAM_BETA_MAX, "epsilon": 1e-30},
        "ftrl": {},
    }
    for name, params in smallest.items():
        opt = get_optimizer(OptimizerConfig(name, 1e-30, params))
        rows = np.zeros((4, 3 + opt.state_floats(3)), np.float32)
        opt.init_state(rows, 3)
        opt.apply(rows, np.zeros((4, 3), np.float32))
        assert np.isfinite(rows).all(), name


def test_spelled_out_defaults_mean_the_same_optimizer():
    implicit = OptimizerConfig("adagrad", 0.1)
    explicit = OptimizerConfig("adagrad", 0.1, {"initial_accumulator": 0.1, "epsilon": 1e-7})
    assert implicit != explicit and implicit.normalized() == explicit.normalized()


# ---- every optimizer against a per-row Python reference, through a real table ----------------------------------
import math  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ps.config import InitializerConfig, TableConfig  # noqa: E402
from ps.engine import tablemaker  # noqa: E402
from ps.engine.shard import Shard  # noqa: E402
from ps.rows.initializers import init_rows  # noqa: E402
from ps.server_config import ServerConfig  # noqa: E402
from worker.client import sum_duplicates  # noqa: E402

DIM = 3
PARAMS = {
    "sgd": (0.1, {}),
    "adagrad": (0.1, {"initial_accumulator": 0.5, "epsilon": 1e-6}),
    "adagrad_rowwise": (0.1, {"initial_accumulator": 0.2, "epsilon": 1e-6}),
    "adam": (0.01, {"beta1": 0.8, "beta2": 0.95, "epsilon": 1e-6}),
    "ftrl": (0.5, {"beta": 1.0, "l1": 0.05, "l2": 0.1}),
}


def reference_step(name, lr, p, w, state, g):
    """One step for one row, in float64, written from the formulas; returns (w, state)."""
    w, g = list(w), list(g)
    if name == "sgd":
        return [wi - lr * gi for wi, gi in zip(w, g)], state
    if name == "adagrad":
        a = [ai + gi * gi for ai, gi in zip(state, g)]
        return [wi - lr * gi / (math.sqrt(ai) + p["epsilon"]) for wi, gi, ai in zip(w, g, a)], a
    if name == "adagrad_rowwise":
        a = state[0] + sum(gi * gi for gi in g) / len(g)
        return [wi - lr * gi / (math.sqrt(a) + p["epsilon"]) for wi, gi in zip(w, g)], [a]
    if name == "adam":
        m, v, t = state[:DIM], state[DIM : 2 * DIM], state[2 * DIM] + 1
        m = [p["beta1"] * mi + (1 - p["beta1"]) * gi for mi, gi in zip(m, g)]
        v = [p["beta2"] * vi + (1 - p["beta2"]) * gi * gi for vi, gi in zip(v, g)]
        c1, c2 = 1 - p["beta1"] ** t, 1 - p["beta2"] ** t
        w = [wi - lr * (mi / c1) / (math.sqrt(vi / c2) + p["epsilon"]) for wi, mi, vi in zip(w, m, v)]
        return w, m + v + [t]
    z, n = state[:DIM], state[DIM:]
    new_w, new_z, new_n = [], [], []
    for wi, zi, ni, gi in zip(w, z, n, g):
        sigma = (math.sqrt(ni + gi * gi) - math.sqrt(ni)) / lr
        zi += gi - sigma * wi
        ni += gi * gi
        if abs(zi) <= p["l1"]:
            wi = 0.0
        else:
            wi = -(zi - math.copysign(p["l1"], zi)) / ((p["beta"] + math.sqrt(ni)) / lr + p["l2"])
        new_w.append(wi), new_z.append(zi), new_n.append(ni)
    return new_w, new_z + new_n


def reference_initial_state(name, p, lr, w):
    if name == "adagrad":
        return [p["initial_accumulator"]] * DIM
    if name == "adagrad_rowwise":
        return [p["initial_accumulator"]]
    if name == "adam":
        return [0.0] * (2 * DIM + 1)
    if name == "ftrl":
        return [-wi * (p["beta"] / lr + p["l2"]) - math.copysign(p["l1"], wi) * (wi != 0) for wi in w] + [0.0] * DIM
    return []


@pytest.mark.parametrize("name", sorted(PARAMS))
@settings(max_examples=15, deadline=None)
@given(
    pushes=st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=10), min_size=1, max_size=8),
    seed=st.integers(0, 99),
)
def test_optimizer_matches_reference_over_random_pushes(tmp_path_factory, name, pushes, seed):
    lr, params = PARAMS[name]
    init = InitializerConfig("uniform", 0.3, seed=5)
    cfg = TableConfig("t", DIM, init, OptimizerConfig(name, lr, params))
    shard = Shard(ServerConfig(data_dir=str(tmp_path_factory.mktemp("opt"))))
    try:
        shard.create_table(cfg)
        full = get_optimizer(cfg.optimizer).given_params
        rng = np.random.default_rng(seed)
        model = {}
        for batch in pushes:  # duplicate ids within a batch: summed first, as the client does
            ids = np.array(batch, dtype=np.uint64)
            grads = rng.normal(0, 1, (len(ids), DIM)).astype(np.float32)
            uniq, summed = sum_duplicates(ids, grads)
            shard.push("t", uniq, summed)
            for i, g in zip(uniq.tolist(), summed.astype(np.float64)):
                if i not in model:
                    w0 = np.empty((1, DIM), dtype=np.float32)
                    init_rows(init, np.array([i], dtype=np.uint64), w0, DIM)
                    w0 = w0[0].astype(np.float64).tolist()
                    model[i] = (w0, reference_initial_state(name, full, lr, w0))
                model[i] = reference_step(name, lr, full, *model[i], g)
        ids = np.array(sorted(model), dtype=np.uint64)
        got = shard.table("t").peek(ids)[:, : shard.table("t").stats_col].astype(np.float64)
        want = np.array([model[i][0] + list(model[i][1]) for i in sorted(model)])
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    finally:
        shard.close()


@pytest.mark.parametrize("name", sorted(set(PARAMS) - {"sgd"}))  # sgd: test_update's first-non-finite test
def test_a_push_whose_step_overflows_a_row_is_refused_whole_and_denormal_gradients_step_as_the_formula(tmp_path, name):
    """A gradient of 1e20 is finite, but its square (each optimizer's accumulator) is not in float32: the push is
    refused naming that id, and no row changes, its other ids' included. Denormal gradients are taken: their
    squares underflow to 0, and the rows are the float64 formula's."""
    lr, params = PARAMS[name]
    init = InitializerConfig("uniform", 0.3, seed=5)
    cfg = TableConfig("t", DIM, init, OptimizerConfig(name, lr, params))
    full = get_optimizer(cfg.optimizer).given_params
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    try:
        table = shard.create_table(cfg)
        ids = np.arange(1, 9, dtype=np.uint64)
        shard.push("t", ids, np.random.default_rng(0).normal(0, 1, (8, DIM)).astype(np.float32))
        before = table.peek(ids).copy()
        huge = np.full((8, DIM), 0.5, np.float32)
        huge[5, 1] = 1e20
        with pytest.raises(InvalidArgumentError, match=f"would make the row of id {int(ids[5])} non-finite"):
            shard.push("t", ids, huge)
        np.testing.assert_array_equal(table.peek(ids), before)
        tiny = np.array([[1e-45, -1e-40, 0.0]] * 8, np.float32)  # denormals (and a zero)
        shard.push("t", ids, tiny)
        got = table.peek(ids)[:, : table.stats_col].astype(np.float64)
        for k in range(8):
            w, state = reference_step(name, lr, full, before[k, :DIM], before[k, DIM : table.stats_col], tiny[k])
            np.testing.assert_allclose(got[k], [*w, *state], rtol=1e-5, atol=1e-30)
    finally:
        shard.close()


def test_an_ftrl_table_of_beta_0_and_l2_0_refuses_a_gradient_squaring_to_0_saying_why(tmp_path, monkeypatch):
    """Such a table (one a data dir holds from before ps.newtable.check_new refused the settings) divides by
    sqrt(n) alone: a gradient whose float32 square is 0 (|g| <= 2**-75) on a dim whose n is 0 would make the row
    non-finite, and the refusal names the parameters, the dim and what to set, not an overflow; the next float32 up
    is taken. A dim whose n is not 0 (dim 1 of id 2) is not named; an overflow is still called one."""
    monkeypatch.setattr(tablemaker, "check_new", lambda cfg: None)
    cfg = TableConfig("t", DIM, InitializerConfig("zeros"), OptimizerConfig("ftrl", 0.05, {"beta": 0.0, "l2": 0.0}))
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    try:
        table = shard.create_table(cfg)
        ids = np.array([1, 2], np.uint64)
        shard.push("t", ids[1:], np.array([[0.0, 0.5, 0.0]], np.float32))  # id 2: n > 0 at dim 1 only
        before = table.peek(ids).copy()
        tiny = np.float32(2.0**-75)
        assert tiny * tiny == 0 and np.nextafter(tiny, np.float32(1)) ** 2 > 0
        grads = np.array([[0.0, 0.0, 0.0], [0.0, -tiny, tiny]], np.float32)
        message = (r"push to table 't' would make the row of id 2 non-finite \(gradient \[0.0, -2.6\d*e-23, 2.6\d*e-23\]\): "
                   r"ftrl with beta 0 and l2 0 divides by \(beta \+ sqrt\(n\)\) / learning_rate \+ l2, 0 at dim 2: its n "
                   r"is 0 and its gradient 2.6\d*e-23 squares to 0 in float32 \(\|g\| <= 2.6e-23\); give the table's "
                   r"ftrl params.beta > 0 \(default 1\) or params.l2 > 0; nothing was applied$")  # fmt: skip
        with pytest.raises(InvalidArgumentError, match=message):
            shard.push("t", ids, grads)
        np.testing.assert_array_equal(table.peek(ids), before)
        grads[1, 2] = np.nextafter(tiny, np.float32(1))
        shard.push("t", ids, grads)
        after = table.peek(ids)
        assert np.isfinite(after).all() and after[1, 2] < 0
        with pytest.raises(
            InvalidArgumentError, match=r"non-finite \(gradient \[0.0, 1[\d.]*e\+20, 0.0\]\): float32 overflow;"
        ):
            shard.push("t", ids, np.array([[0.0, 0.0, 0.0], [0.0, 1e20, 0.0]], np.float32))
    finally:
        shard.close()
