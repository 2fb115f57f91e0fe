import numpy as np
import pytest

from ps.config import OptimizerConfig
from ps.errors import InvalidArgumentError
from ps.optim import get_optimizer


def _rows(n, width, seed=0):
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


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
        (OptimizerConfig("adam"), "optimizer 'adam' is unknown"),
        (OptimizerConfig("adagrad", 0.1, {"beta1": 0.9}), r"unknown parameters \['beta1'\]"),
        (OptimizerConfig("adagrad", 0.1, {"initial_accumulator": -1}), "initial_accumulator must be finite, >= 0"),
        (OptimizerConfig("adagrad", 0.1, {"epsilon": 0.0}), "epsilon must be finite, > 0"),
        (OptimizerConfig("adagrad", 0.1, {"epsilon": float("nan")}), "epsilon must be finite"),
        (OptimizerConfig("adagrad", 0.1, {"initial_accumulator": 1e39}), "<= 1e\\+30, got 1e\\+39"),
        (OptimizerConfig("sgd", 0.1, {"x": 1.0}), "unknown parameters"),
    ],
)
def test_bad_optimizer_configs_are_rejected(cfg, message):
    with pytest.raises(InvalidArgumentError, match=message):
        get_optimizer(cfg)


@pytest.mark.parametrize("lr", [0.0, -1.0, float("inf"), 1e39])
def test_bad_learning_rates_are_rejected(lr):
    with pytest.raises(InvalidArgumentError, match="learning_rate must be finite, > 0"):
        OptimizerConfig("sgd", lr).validate()


def test_spelled_out_defaults_mean_the_same_optimizer():
    implicit = OptimizerConfig("adagrad", 0.1)
    explicit = OptimizerConfig("adagrad", 0.1, {"initial_accumulator": 0.1, "epsilon": 1e-7})
    assert implicit != explicit and implicit.normalized() == explicit.normalized()
