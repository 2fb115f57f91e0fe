"""Tests for worker/metrics.py against direct per-element and pairwise oracles."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.metrics import RunningMean, auc, logloss, sigmoid


def pairwise_auc(labels, scores):
    """O(n^2) oracle: fraction of (positive, negative) pairs ordered correctly, ties counting 1/2."""
    pos = [s for y, s in zip(labels, scores) if y == 1]
    neg = [s for y, s in zip(labels, scores) if y == 0]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 1), st.one_of(st.integers(-3, 3), st.floats(-1e6, 1e6, allow_nan=False))),
        min_size=2,
        max_size=60,
    )
)
def test_auc_matches_pairwise_oracle_including_ties(pairs):
    labels = np.array([y for y, _ in pairs], dtype=np.float32)
    scores = np.array([float(s) for _, s in pairs])
    if labels.min() == labels.max():
        assert math.isnan(auc(labels, scores))
    else:
        assert auc(labels, scores) == pytest.approx(pairwise_auc(labels, scores), abs=1e-12)


def test_auc_extremes_and_all_tied():
    labels = np.array([0, 0, 1, 1])
    assert auc(labels, np.array([0.1, 0.2, 0.3, 0.4])) == 1.0
    assert auc(labels, np.array([0.4, 0.3, 0.2, 0.1])) == 0.0
    assert auc(labels, np.zeros(4)) == 0.5
    assert math.isnan(auc(np.ones(5), np.arange(5)))
    assert math.isnan(auc(np.zeros(0), np.zeros(0)))


def test_auc_rejects_nan_and_length_mismatch():
    with pytest.raises(ValueError):
        auc(np.array([0, 1]), np.array([0.5, np.nan]))
    with pytest.raises(ValueError):
        auc(np.array([0, 1, 1]), np.array([0.5, 0.2]))


def test_auc_large_input_agrees_with_binned_oracle():
    # 200K rows with heavy ties (scores in 50 levels): compare with an O(levels^2) pairwise count.
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 50, size=200_000)
    labels = (rng.random(200_000) < scores / 60).astype(np.int8)
    pos = np.bincount(scores[labels == 1], minlength=50).astype(np.float64)
    neg = np.bincount(scores[labels == 0], minlength=50).astype(np.float64)
    wins = sum(pos[i] * (neg[:i].sum() + 0.5 * neg[i]) for i in range(50))
    assert auc(labels, scores) == pytest.approx(wins / (pos.sum() * neg.sum()), abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.floats(0, 1)), min_size=1, max_size=40))
def test_logloss_matches_direct_formula(pairs):
    eps = 1e-7
    expected = 0.0
    for y, p in pairs:
        p = min(max(p, eps), 1 - eps)
        expected -= y * math.log(p) + (1 - y) * math.log(1 - p)
    labels = np.array([y for y, _ in pairs])
    probs = np.array([p for _, p in pairs])
    assert logloss(labels, probs, eps) == pytest.approx(expected / len(pairs), rel=1e-9, abs=1e-12)


def test_logloss_is_finite_at_certain_wrong_predictions():
    assert logloss(np.array([1, 0]), np.array([0.0, 1.0])) == pytest.approx(-math.log(1e-7), rel=1e-6)
    assert logloss(np.array([1, 0]), np.array([1.0, 0.0])) < 1e-6


def test_sigmoid_is_stable_and_correct():
    x = np.array([-1000.0, -30.0, -1.0, 0.0, 2.5, 30.0, 1000.0])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        y = sigmoid(x)
    for xi, yi in zip(x, y):
        expected = 1 / (1 + math.exp(-xi)) if xi > -700 else 0.0
        assert yi == pytest.approx(expected, rel=1e-12, abs=1e-300)
    assert np.allclose(sigmoid(-x), 1 - y)
    assert sigmoid(np.float32([1.0, -200.0])).dtype == np.float32
    assert sigmoid(np.array([3])).dtype == np.float64


def test_running_mean():
    m = RunningMean(decay=0.5)
    assert math.isnan(m.value)
    assert m.update(4.0) == 4.0  # no warm-up bias toward zero
    assert m.update(1.0) == pytest.approx((0.5 * 4 + 1) / 1.5)
    assert m.update(2.0, weight=3.0) == pytest.approx((0.25 * 4 + 0.5 * 1 + 3 * 2) / (0.25 + 0.5 + 3))
    last = RunningMean(decay=0.0)
    for v in (3.0, 7.0, 5.0):
        last.update(v)
    assert last.value == 5.0
    with pytest.raises(ValueError):
        RunningMean(decay=1.0)
