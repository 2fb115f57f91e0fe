"""Model gradients against central finite differences of the summed logloss, in float64."""

import numpy as np
import pytest

from ps.config import OptimizerConfig
from worker.models import MODELS


def summed_logloss(model, rows, labels):
    p = model.predict(rows)
    return float(-(labels * np.log(p) + (1 - labels) * np.log(1 - p)).sum())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_gradients_match_finite_differences(name):
    model = MODELS[name](3, OptimizerConfig())
    rng = np.random.default_rng(0)
    rows = rng.normal(0, 0.5, (5, 4, model.dim))
    labels = np.array([0, 1, 1, 0, 1], dtype=np.float64)
    probs, grads = model.forward_backward(rows, labels)
    np.testing.assert_allclose(probs, model.predict(rows))
    assert grads.shape == rows.shape
    eps = 1e-6
    numeric = np.zeros_like(rows)
    for idx in np.ndindex(rows.shape):
        plus, minus = rows.copy(), rows.copy()
        plus[idx] += eps
        minus[idx] -= eps
        numeric[idx] = (summed_logloss(model, plus, labels) - summed_logloss(model, minus, labels)) / (2 * eps)
    np.testing.assert_allclose(grads, numeric, rtol=1e-4, atol=1e-6)


def test_fm_logit_equals_the_pairwise_sum():
    model = MODELS["fm"](2, OptimizerConfig())
    rows = np.random.default_rng(1).normal(size=(3, 5, 3))
    w, v = rows[:, :, 0], rows[:, :, 1:]
    pairs = sum((v[:, i] * v[:, j]).sum(axis=1) for i in range(5) for j in range(i + 1, 5))
    np.testing.assert_allclose(model.logits(rows), w.sum(axis=1) + pairs)
