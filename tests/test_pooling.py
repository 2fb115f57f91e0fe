"""Pooling of bags (worker/models/pooling.py) against a loop written out from its formulas and against the torch
backend's pooling with autograd: random bags with empty ones, ids repeated within a bag, weights, every mode; the
gather and scatter-add of one id per bag; zero denominators; bags that do not fit their rows."""

import numpy as np
import pytest
import torch

from worker.models.pooling import bag_scales, one_id_per_bag, pool, pool_backward
from worker.models.spec import POOLINGS, FieldInput
from worker.models.torch_backend import pool_torch


def random_bags(
    rng: np.random.Generator, n: int, num_rows: int, weighted: bool, max_len: int = 4, signed: bool = False
) -> FieldInput:
    """n bags over num_rows rows: bag 0 empty, bag 1 holding one id twice, the rest of random lengths in
    [0, max_len]; weights in [0.2, 1.5] when weighted, of random signs as well when signed."""
    lengths = rng.integers(0, max_len + 1, n)
    lengths[0], lengths[1] = 0, 3
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    index = rng.integers(0, num_rows, offsets[-1])
    index[offsets[1] + 1] = index[offsets[1]]
    weights = rng.uniform(0.2, 1.5, len(index)).astype(np.float32) if weighted else None
    if weights is not None and signed:
        weights *= rng.choice(np.array([-1, 1], np.float32), len(weights))
    return FieldInput(index, offsets, weights)


def oracle_scale(weights: np.ndarray, mode: str) -> float:
    """1 / the denominator of one bag with these weights (0 for a zero denominator)."""
    denominator = {"sum": 1.0, "mean": np.abs(weights).sum(), "sqrtn": np.sqrt((weights * weights).sum())}[mode]
    return 1.0 / denominator if denominator != 0 else 0.0


def oracle_pool(rows: np.ndarray, bags: FieldInput, mode: str) -> np.ndarray:
    """The module docstring's formulas, bag by bag, in float64."""
    n = len(bags.offsets) - 1
    out = np.zeros((n, rows.shape[1]))
    for i in range(n):
        ids = bags.index[bags.offsets[i] : bags.offsets[i + 1]]
        w = np.ones(len(ids)) if bags.weights is None else bags.weights[bags.offsets[i] : bags.offsets[i + 1]]
        w = np.asarray(w, dtype=np.float64)
        out[i] = (w[:, None] * rows[ids]).sum(axis=0) * oracle_scale(w, mode)
    return out


def oracle_backward(grad: np.ndarray, bags: FieldInput, mode: str, num_rows: int) -> np.ndarray:
    """d/d row r = sum over the occurrences j of r: w_j / denominator of j's bag * d/d its pooled vector."""
    out = np.zeros((num_rows, grad.shape[1]))
    for i in range(len(grad)):
        a, b = bags.offsets[i], bags.offsets[i + 1]
        w = np.ones(b - a) if bags.weights is None else np.asarray(bags.weights[a:b], dtype=np.float64)
        for j, r in enumerate(bags.index[a:b]):
            out[r] += w[j] * oracle_scale(w, mode) * grad[i]
    return out


@pytest.mark.parametrize("mode", POOLINGS)
@pytest.mark.parametrize("weighted, signed", [(False, False), (True, False), (True, True)])
def test_pooling_follows_its_formulas(mode, weighted, signed):
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(7, 3))
    bags = random_bags(rng, 30, 7, weighted, signed=signed)
    pooled = pool(rows, bags.index, bags.offsets, bags.weights, mode)
    assert pooled.dtype == np.float64 and pooled.shape == (30, 3)
    np.testing.assert_allclose(pooled, oracle_pool(rows, bags, mode), rtol=1e-12, atol=1e-12)
    assert (pooled[0] == 0).all()  # the empty bag
    grad = rng.normal(size=(30, 3))
    grads = pool_backward(grad, bags.index, bags.offsets, bags.weights, mode, 7)
    np.testing.assert_allclose(grads, oracle_backward(grad, bags, mode, 7), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", POOLINGS)
@pytest.mark.parametrize("weighted, signed", [(False, False), (True, False), (True, True)])
def test_numpy_and_torch_pool_alike(mode, weighted, signed):
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(50, 5)).astype(np.float32)
    bags = random_bags(rng, 200, 50, weighted, max_len=6, signed=signed)
    grad = rng.normal(size=(200, 5)).astype(np.float32)
    pooled = pool(rows, bags.index, bags.offsets, bags.weights, mode)
    grads = pool_backward(grad, bags.index, bags.offsets, bags.weights, mode, 50)
    assert pooled.dtype == grads.dtype == np.float32
    rows_t = torch.tensor(rows, requires_grad=True)
    pooled_t = pool_torch(rows_t, bags, mode)
    pooled_t.backward(torch.tensor(grad))
    np.testing.assert_allclose(pooled, pooled_t.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads, rows_t.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", POOLINGS)
def test_one_id_per_bag_is_a_gather_and_a_scatter_add(mode):
    rng = np.random.default_rng(2)
    rows = rng.normal(size=(9, 4)).astype(np.float32)
    index = rng.integers(0, 9, 40)  # ids repeat across examples
    offsets = np.arange(41)
    assert one_id_per_bag(offsets, None) and not one_id_per_bag(offsets, np.ones(40, np.float32))
    np.testing.assert_array_equal(pool(rows, index, offsets, None, mode), rows[index])
    grad = rng.normal(size=(40, 4)).astype(np.float32)
    expected = np.zeros((9, 4), np.float32)
    np.add.at(expected, index, grad)
    np.testing.assert_allclose(pool_backward(grad, index, offsets, None, mode, 9), expected, rtol=1e-6, atol=1e-6)
    # the general loop, given weights of 1, computes the same
    ones = np.ones(40, np.float32)
    np.testing.assert_allclose(pool(rows, index, offsets, ones, mode), rows[index], rtol=1e-6)
    np.testing.assert_allclose(pool_backward(grad, index, offsets, ones, mode, 9), expected, rtol=1e-5, atol=1e-6)


def test_zero_denominators_pool_to_zero_and_take_no_gradient():
    rows = np.arange(12, dtype=np.float64).reshape(4, 3) + 1
    index, offsets = np.array([0, 1, 2, 3]), np.array([0, 2, 4])
    weights = np.array([1.0, -1.0, 0.0, 0.0])  # bag 1 is all zero (mean and sqrtn); bag 0 has |w| summing to 2
    np.testing.assert_array_equal(bag_scales(offsets, weights, "mean"), [0.5, 0])
    np.testing.assert_array_equal(bag_scales(offsets, weights, "sqrtn"), [1 / np.sqrt(2), 0])
    for mode in ("mean", "sqrtn"):
        pooled = pool(rows, index, offsets, weights, mode)
        grads = pool_backward(np.ones((2, 3)), index, offsets, weights, mode, 4)
        assert (pooled[1] == 0).all() and (grads[2:] == 0).all(), mode


@pytest.mark.parametrize("w1", [-1.0, -1.0 + 2.0**-23, -1.0 - 2.0**-23])
def test_mean_of_weights_that_cancel_stays_within_its_rows(w1):
    """mean divides by sum |w|: weights 1 and about -1 (summing to 0 or 1.2e-7) pool to (r0 - r1 w) / (1 + |w|),
    no larger than the larger row, on both backends, with the gradient torch's autograd takes of that formula."""
    rows = np.array([[0.5, -0.25, 2.0], [1.5, 0.75, -2.0], [0.1, 0.2, 0.3]], np.float32)
    index, offsets = np.array([0, 1, 2, 0]), np.array([0, 2, 4])
    weights = np.array([1.0, w1, 3.0, -0.5], np.float32)
    rows64 = torch.tensor(rows, dtype=torch.float64, requires_grad=True)
    w64 = torch.tensor(weights, dtype=torch.float64)
    expected_t = torch.stack(
        [(w64[a:b, None] * rows64[index[a:b]]).sum(0) / w64[a:b].abs().sum() for a, b in ((0, 2), (2, 4))]
    )
    grad = np.array([[1.0, -2.0, 0.5], [0.25, 1.0, -1.0]], np.float32)
    expected_t.backward(torch.tensor(grad, dtype=torch.float64))
    expected = expected_t.detach().numpy()
    assert np.abs(expected).max() <= np.abs(rows).max()
    pooled = pool(rows, index, offsets, weights, "mean")
    np.testing.assert_allclose(pooled, expected, rtol=1e-6, atol=1e-7)
    grads = pool_backward(grad, index, offsets, weights, "mean", 3)
    np.testing.assert_allclose(grads, rows64.grad.numpy(), rtol=1e-6, atol=1e-7)
    rows_t = torch.tensor(rows, requires_grad=True)
    pooled_t = pool_torch(rows_t, FieldInput(index, offsets, weights), "mean")
    pooled_t.backward(torch.tensor(grad))
    np.testing.assert_allclose(pooled_t.detach().numpy(), expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(rows_t.grad.numpy(), rows64.grad.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["mean", "sqrtn"])
def test_tiny_weights_pool_to_their_rows_on_both_backends(mode):
    """Weights below float32's smallest normal number (1e-40, 1e-44: a weighted column's cells read as float32)
    pool as the formula says: one id of any weight pools, under mean and sqrtn, to its row; two of equal weights to
    their mean (mean) or their sum / sqrt(2) (sqrtn). The sum was taken before the scale: numpy's rows times 1e-44
    underflowed (a row of 0.5 pooled to 0.571), and torch's float32 scale of 1e44 was inf (inf and nan pooled)."""
    rows = np.array([[0.5, -0.25, 0.0], [1.5, 0.75, -2.0]], np.float32)
    index, offsets = np.array([0, 1, 0, 1]), np.array([0, 1, 2, 4])
    expected = np.vstack([rows, (rows[0] + rows[1]) / (2 if mode == "mean" else np.sqrt(2))])
    for w in (1e-40, 1e-44):
        weights = np.full(4, w, np.float32)
        np.testing.assert_allclose(pool(rows, index, offsets, weights, mode), expected, rtol=1e-6)
        rows_t = torch.tensor(rows, requires_grad=True)
        pooled_t = pool_torch(rows_t, FieldInput(index, offsets, weights), mode)
        np.testing.assert_allclose(pooled_t.detach().numpy(), expected, rtol=1e-6)
        pooled_t.backward(torch.ones(3, 3))
        grads = pool_backward(np.ones((3, 3), np.float32), index, offsets, weights, mode, 2)
        scale = 1.5 if mode == "mean" else 1 + 1 / np.sqrt(2)  # d (pooled rows summed) / d each row
        np.testing.assert_allclose(grads, np.full((2, 3), scale), rtol=1e-6)
        np.testing.assert_allclose(rows_t.grad.numpy(), grads, rtol=1e-6)


@pytest.mark.parametrize("mode", ["mean", "sqrtn"])
def test_float64_weights_outside_float32s_range_pool_float32_rows_on_both_backends(mode):
    """Weights given in float64 (np.array of Python floats), beyond what float32 holds (1e-50 rounds to 0, 1e40 to
    inf), over float32 rows: one id alone pools to its row and takes the whole gradient, as the formula says,
    two of equal weights to their mean or sum / sqrt(2), on both backends."""
    rows = np.array([[0.5, -0.25, 0.0], [1.5, 0.75, -2.0]], np.float32)
    index, offsets = np.array([0, 1, 0, 1]), np.array([0, 1, 2, 4])
    expected = np.vstack([rows, (rows[0] + rows[1]) / (2 if mode == "mean" else np.sqrt(2))])
    scale = 1.5 if mode == "mean" else 1 + 1 / np.sqrt(2)  # d (pooled rows summed) / d each row
    for w in (1e-50, 1e40):
        weights = np.full(4, w)
        np.testing.assert_allclose(pool(rows, index, offsets, weights, mode), expected, rtol=1e-6)
        grads = pool_backward(np.ones((3, 3), np.float32), index, offsets, weights, mode, 2)
        np.testing.assert_allclose(grads, np.full((2, 3), scale), rtol=1e-6)
        rows_t = torch.tensor(rows, requires_grad=True)
        pooled_t = pool_torch(rows_t, FieldInput(index, offsets, weights), mode)
        np.testing.assert_allclose(pooled_t.detach().numpy(), expected, rtol=1e-6)
        pooled_t.backward(torch.ones(3, 3))
        np.testing.assert_allclose(rows_t.grad.numpy(), grads, rtol=1e-6)


def test_empty_batches_and_empty_bags():
    rows = np.ones((3, 2), np.float32)
    assert pool(rows, np.zeros(0, np.int64), np.zeros(1, np.int64), None, "mean").shape == (0, 2)
    pooled = pool(rows, np.zeros(0, np.int64), np.zeros(4, np.int64), None, "mean")
    assert pooled.shape == (3, 2) and (pooled == 0).all()
    grads = pool_backward(np.ones((3, 2), np.float32), np.zeros(0, np.int64), np.zeros(4, np.int64), None, "sum", 3)
    assert grads.shape == (3, 2) and (grads == 0).all()


def test_backward_adds_into_out():
    rng = np.random.default_rng(3)
    bags = random_bags(rng, 10, 5, weighted=True)
    grad = rng.normal(size=(10, 2))
    out = np.full((5, 2), 1.0)
    returned = pool_backward(grad, bags.index, bags.offsets, bags.weights, "sqrtn", 5, out=out)
    assert returned is out
    np.testing.assert_allclose(out, 1.0 + oracle_backward(grad, bags, "sqrtn", 5), rtol=1e-12)
    with pytest.raises(ValueError, match=r"out has shape \(4, 2\), expected contiguous \(5, 2\)"):
        pool_backward(grad, bags.index, bags.offsets, bags.weights, "sqrtn", 5, out=np.zeros((4, 2)))


def test_bags_that_do_not_fit_are_clear_errors():
    rows = np.ones((3, 2), np.float32)
    with pytest.raises(ValueError, match=r"index runs from 0 to 3, expected 0 to 2"):
        pool(rows, [0, 3], [0, 1, 2], None, "sum")
    with pytest.raises(ValueError, match=r"index runs from -1 to 0"):
        pool(rows, [0, -1], [0, 1, 2], None, "sum")
    with pytest.raises(ValueError, match=r"offsets run from 0 to 1, expected 0 to len\(index\) = 2"):
        pool(rows, [0, 1], [0, 1], None, "sum")
    with pytest.raises(ValueError, match="offsets decrease"):
        pool(rows, [0, 1], [0, 2, 1, 2], None, "sum")
    with pytest.raises(ValueError, match=r"weights have shape \(1,\)"):
        pool(rows, [0, 1], [0, 1, 2], np.ones(1, np.float32), "sum")
    with pytest.raises(ValueError, match="pooling 'max'"):
        pool(rows, [0, 1], [0, 2], None, "max")
    with pytest.raises(ValueError, match=r"3 offsets, expected n \+ 1 = 4"):
        pool_backward(np.ones((3, 2)), [0, 1], [0, 1, 2], None, "sum", 3)
