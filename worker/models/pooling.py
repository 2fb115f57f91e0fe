"""Pooling a field's bags of rows into one vector per example, and its gradient back into the rows (numpy).

A field's bags (worker/models/spec.py, FieldInput): example i's bag is index[offsets[i]:offsets[i + 1]], rows of
a table's unique rows, each with a weight w_j (1 when weights is None). A bag pools to

    sum:    p = sum_j w_j r_j
    mean:   p = sum_j w_j r_j / sum_j |w_j|
    sqrtn:  p = sum_j w_j r_j / sqrt(sum_j w_j^2)

an empty bag, or one whose denominator is 0, to 0 (and its rows take no gradient). mean is the weighted mean for
weights >= 0, and with weights of any signs its pooled vector is never larger than its largest row (weights of
mixed signs summing to nearly 0 do not blow it up). So p = sum_j (scale w_j) r_j with one scale per bag
(bag_scales), each weight scaled before its row is added (a weight of 1e-40 alone pools to its row, not to an
underflowed product times 1e40), and d loss / d r = sum over the bags holding r of scale * w_j * d loss / d p.
A field of one id per example and no weights (a categorical field) pools to a gather and its gradient is a
scatter-add. The loops are compiled (numba, nogil) and run in the dtype of the rows.
"""

from __future__ import annotations

import numba
import numpy as np

from worker.models.spec import POOLINGS


def checked_bags(
    index: np.ndarray,
    offsets: np.ndarray,
    weights: np.ndarray | None,
    num_rows: int,
    n: int | None = None,
    what: str = "bags",
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(index int64, offsets int64, weights or None) of valid bags over num_rows rows (n bags when n is given);
    ValueError naming `what` otherwise: offsets 1-d from 0, non-decreasing, ending at len(index); index 1-d
    integers in [0, num_rows); weights None or one float per id."""
    index, offsets = np.asarray(index), np.asarray(offsets)
    if index.ndim != 1 or not (index.dtype.kind in "iu" or index.size == 0):
        raise ValueError(f"{what}: index has shape {index.shape} and dtype {index.dtype}, expected 1-d integers")
    if offsets.ndim != 1 or len(offsets) < 1 or offsets.dtype.kind not in "iu":
        raise ValueError(f"{what}: offsets have shape {offsets.shape} and dtype {offsets.dtype}, expected 1-d integers")
    if n is not None and len(offsets) != n + 1:
        raise ValueError(f"{what}: {len(offsets)} offsets, expected n + 1 = {n + 1}")
    if offsets[0] != 0 or offsets[-1] != len(index):
        raise ValueError(
            f"{what}: offsets run from {offsets[0]} to {offsets[-1]}, expected 0 to len(index) = {len(index)}"
        )
    if len(offsets) > 1 and (offsets[1:] < offsets[:-1]).any():
        raise ValueError(f"{what}: offsets decrease")
    _check_index_range(index, num_rows, what)
    if weights is not None:
        weights = np.asarray(weights)
        if weights.shape != index.shape or weights.dtype.kind != "f":
            raise ValueError(
                f"{what}: weights have shape {weights.shape} and dtype {weights.dtype}, expected {index.shape} floats"
            )
    return index.astype(np.int64, copy=False), offsets.astype(np.int64, copy=False), weights


def checked_index(index: np.ndarray, num_rows: int, nnz: int, what: str = "bags") -> np.ndarray:
    """index as int64, checked as checked_bags checks it: 1-d integers in [0, num_rows), nnz of them."""
    index = np.asarray(index)
    if index.shape != (nnz,) or not (index.dtype.kind in "iu" or index.size == 0):
        raise ValueError(f"{what}: index has shape {index.shape} and dtype {index.dtype}, expected ({nnz},) integers")
    _check_index_range(index, num_rows, what)
    return index.astype(np.int64, copy=False)


def _check_index_range(index: np.ndarray, num_rows: int, what: str) -> None:
    if index.size and (index.min() < 0 or index.max() >= num_rows):
        raise ValueError(f"{what}: index runs from {index.min()} to {index.max()}, expected 0 to {num_rows - 1}")


def one_id_per_bag(offsets: np.ndarray, weights: np.ndarray | None) -> bool:
    """Whether every bag holds exactly one id and there are no weights: pooling is then a gather (any mode)."""
    return weights is None and bool((offsets[1:] - offsets[:-1] == 1).all())


def scaled_weights(offsets: np.ndarray, weights: np.ndarray | None, mode: str) -> np.ndarray:
    """float64 (nnz,): each id's weight (1 when weights is None) times its bag's scale (bag_scales): the factor of
    its row in the pooled vector."""
    offsets = np.asarray(offsets, dtype=np.int64)
    per_id = np.repeat(bag_scales(offsets, weights, mode), np.diff(offsets))
    return per_id if weights is None else per_id * np.asarray(weights, dtype=np.float64)


def bag_scales(offsets: np.ndarray, weights: np.ndarray | None, mode: str) -> np.ndarray:
    """float64 (n,): each bag's 1 / denominator (1 for sum; 0 where the denominator is 0 or the bag is empty)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    out = np.empty(len(offsets) - 1, dtype=np.float64)
    _bag_scales(offsets, *_weights_arg(weights, np.float64), _mode_code(mode), out)
    return out


def pool(rows: np.ndarray, index: np.ndarray, offsets: np.ndarray, weights: np.ndarray | None, mode: str) -> np.ndarray:
    """(n, d) pooled bags of rows (u, d), in the dtype of rows (see the module docstring)."""
    rows = np.ascontiguousarray(rows)
    index, offsets, weights = checked_bags(index, offsets, weights, len(rows))
    if one_id_per_bag(offsets, weights):
        return rows.take(index, axis=0)
    out = np.zeros((len(offsets) - 1, rows.shape[1]), dtype=rows.dtype)
    _pool(rows, index, offsets, *_weights_arg(weights), bag_scales(offsets, weights, mode), out)
    return out


def pool_backward(
    grad_pooled: np.ndarray,
    index: np.ndarray,
    offsets: np.ndarray,
    weights: np.ndarray | None,
    mode: str,
    num_rows: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """d loss / d rows (num_rows, d) from d loss / d pooled (n, d), in the dtype of grad_pooled; added into `out`
    (num_rows, d) and returned when it is given."""
    grad_pooled = np.ascontiguousarray(grad_pooled)
    index, offsets, weights = checked_bags(index, offsets, weights, num_rows, n=len(grad_pooled))
    if out is None:
        out = np.zeros((num_rows, grad_pooled.shape[1]), dtype=grad_pooled.dtype)
    elif out.shape != (num_rows, grad_pooled.shape[1]) or not out.flags.c_contiguous:
        raise ValueError(f"out has shape {out.shape}, expected contiguous ({num_rows}, {grad_pooled.shape[1]})")
    if one_id_per_bag(offsets, weights):
        _scatter_add(grad_pooled, index, out)
    else:
        scales = bag_scales(offsets, weights, mode)
        _pool_backward(grad_pooled, index, offsets, *_weights_arg(weights), scales, out)
    return out


def _mode_code(mode: str) -> int:
    if mode not in POOLINGS:
        raise ValueError(f"pooling {mode!r}, expected one of {list(POOLINGS)}")
    return POOLINGS.index(mode)


def _exact_dtype(weights: np.ndarray | None) -> type:
    """The dtype the compiled loops take weights in: float32 weights as they are, any others in float64, so no weight
    is rounded before its bag's scale multiplies it in float64, as in torch's scaled_weights (rounded to float32,
    a float64 weight of 1e-50 would be 0 and one of 1e40 inf)."""
    return np.float32 if weights is not None and weights.dtype == np.float32 else np.float64


def _weights_arg(weights: np.ndarray | None, dtype: type | None = None) -> tuple[np.ndarray, bool]:
    """(weights in dtype, has_weights): the compiled loops take an empty array for no weights. dtype None: the
    pooling loops' (_exact_dtype)."""
    if dtype is None:
        dtype = _exact_dtype(weights)
    if weights is None:
        return np.empty(0, dtype=dtype), False
    return np.ascontiguousarray(weights, dtype=dtype), True


SUM, MEAN, SQRTN = (POOLINGS.index(m) for m in ("sum", "mean", "sqrtn"))


@numba.njit(nogil=True, cache=True)
def _bag_scales(offsets, weights, has_weights, mode, out):
    for i in range(len(out)):
        if mode == SUM:
            out[i] = 1.0
            continue
        denominator = 0.0
        for j in range(offsets[i], offsets[i + 1]):
            w = weights[j] if has_weights else 1.0
            denominator += abs(w) if mode == MEAN else w * w
        if mode == SQRTN:
            denominator = np.sqrt(denominator)
        out[i] = 1.0 / denominator if denominator != 0.0 else 0.0


@numba.njit(nogil=True, cache=True)
def _pool(rows, index, offsets, weights, has_weights, scales, out):
    d = rows.shape[1]
    for i in range(len(out)):
        s = scales[i]
        for j in range(offsets[i], offsets[i + 1]):
            r = index[j]
            c = (weights[j] if has_weights else 1.0) * s
            for k in range(d):
                out[i, k] += c * rows[r, k]


@numba.njit(nogil=True, cache=True)
def _pool_backward(grad, index, offsets, weights, has_weights, scales, out):
    d = grad.shape[1]
    for i in range(len(grad)):
        s = scales[i]
        if s == 0.0:
            continue
        for j in range(offsets[i], offsets[i + 1]):
            r = index[j]
            c = (weights[j] if has_weights else 1.0) * s
            for k in range(d):
                out[r, k] += c * grad[i, k]


@numba.njit(nogil=True, cache=True)
def _scatter_add(grad, index, out):
    d = grad.shape[1]
    for i in range(len(index)):
        r = index[i]
        for k in range(d):
            out[r, k] += grad[i, k]
