"""The servers' optimizer rules (sgd, adagrad, adam) run on a worker over one flat float32 vector, bit for bit alike
on every worker: the update of the allreduce dense path (worker/allreduce.py), which each worker applies to the
group's mean gradient itself.
"""

from __future__ import annotations

import numba
import numpy as np

from ps.config import OptimizerConfig
from ps.errors import NOTHING_APPLIED


class NonFiniteStepError(ValueError):
    """A step refused because it would make a weight, or its optimizer state, Inf or NaN (float32 overflow); index:
    the first such element of the vector. Nothing of the step was applied."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index


class LocalOptimizer:
    """ps.rows.optim's update (sgd, adagrad, adam) of one flat float32 vector: each element as the servers'
    kernels compute it, every operation a single IEEE-rounded float32 one (none fused or reordered), so equal
    inputs give equal bits on any machine. Adam's bias correction counts this optimizer's steps (each
    step updates every element, as a server counts each id's updates). As a server refuses a push that would make a
    row non-finite, a step that would make any weight or state element non-finite is refused whole
    (NonFiniteStepError): weights, state and the step count stay as they were."""

    SUPPORTED = ("sgd", "adagrad", "adam")

    def __init__(self, cfg: OptimizerConfig, size: int):
        cfg.validate()
        if cfg.name not in self.SUPPORTED:
            raise ValueError(f"the allreduce dense path runs {list(self.SUPPORTED)}, not {cfg.name!r}")
        p = {k: np.float32(v) for k, v in cfg.all_params().items()}
        self.name, self.lr, self.params, self.steps = cfg.name, np.float32(cfg.learning_rate), p, 0
        if cfg.name == "adagrad":
            self.accumulator = np.full(size, p["initial_accumulator"], np.float32)
        if cfg.name == "adam":
            self.m = np.zeros(size, np.float32)
            self.v = np.zeros(size, np.float32)

    def apply(self, weights: np.ndarray, grads: np.ndarray) -> None:
        """One step on weights (float32, in place) with grads of the same shape: a compiled pass that finds the
        first element the step would make non-finite (NonFiniteStepError, nothing changed), then one that steps."""
        p = self.params
        if self.name == "sgd":
            bad = _sgd_step(weights, grads, self.lr, False)
        elif self.name == "adagrad":
            bad = _adagrad_step(weights, grads, self.accumulator, self.lr, p["epsilon"], False)
        else:
            c1, c2 = self._adam_corrections(self.steps + 1)
            args = (weights, grads, self.m, self.v, self.lr, p["beta1"], p["beta2"], p["epsilon"], c1, c2)
            bad = _adam_step(*args, False)
        if bad >= 0:
            raise NonFiniteStepError(
                f"the {self.name} step would make element {bad} non-finite (weight {float(weights[bad])}, gradient "
                f"{float(grads[bad])}): float32 overflow; {NOTHING_APPLIED}",
                bad,
            )
        self.steps += 1
        if self.name == "sgd":
            _sgd_step(weights, grads, self.lr, True)
        elif self.name == "adagrad":
            _adagrad_step(weights, grads, self.accumulator, self.lr, p["epsilon"], True)
        else:
            _adam_step(*args, True)

    def _adam_corrections(self, t: int) -> tuple[np.float32, np.float32]:
        """Adam's 1 - b1^t and 1 - b2^t, each rounded once, to float32."""
        p = self.params
        return np.float32(1.0 - float(p["beta1"]) ** t), np.float32(1.0 - float(p["beta2"]) ** t)


# One pass over the vector each, every operation a float32 one in the order written (no fastmath: nothing fused
# or reordered), so equal inputs give equal bits on every worker. error_model="numpy": a division is IEEE's (no
# check for a zero divisor, which none of these can be), so the loops vectorize.
# Each rule's element update is written once (its _new function) and run by one loop in two modes: commit False
# writes nothing and returns the first element whose new weight or state is not finite (-1: none), counting them
# first in a branch-free pass; commit True writes them (returns -1).
@numba.njit(inline="always")
def _not_finite(x, y, z):
    return (x - x) + (y - y) + (z - z) != 0  # NaN where any is Inf or NaN (Inf - Inf is NaN), else 0; branch-free


@numba.njit(inline="always")
def _sgd_new(w, g, lr):  # w -= lr g
    return w - lr * g


@numba.njit(nogil=True, error_model="numpy", cache=True)
def _sgd_step(w, g, lr, commit):
    if commit:
        for i in range(w.shape[0]):
            w[i] = _sgd_new(w[i], g[i], lr)
        return -1
    bad = 0
    for i in range(w.shape[0]):
        x = _sgd_new(w[i], g[i], lr)
        bad += _not_finite(x, x, x)
    if bad:
        for i in range(w.shape[0]):
            x = _sgd_new(w[i], g[i], lr)
            if _not_finite(x, x, x):
                return i
    return -1


@numba.njit(inline="always")
def _adagrad_new(w, g, a, lr, eps):  # a += g g; w -= lr g / (sqrt(a) + eps)
    a_new = a + g * g
    return w - lr * g / (np.sqrt(a_new) + eps), a_new


@numba.njit(nogil=True, error_model="numpy", cache=True)
def _adagrad_step(w, g, a, lr, eps, commit):
    if commit:
        for i in range(w.shape[0]):
            w[i], a[i] = _adagrad_new(w[i], g[i], a[i], lr, eps)
        return -1
    bad = 0
    for i in range(w.shape[0]):
        w_new, a_new = _adagrad_new(w[i], g[i], a[i], lr, eps)
        bad += _not_finite(w_new, a_new, a_new)
    if bad:
        for i in range(w.shape[0]):
            w_new, a_new = _adagrad_new(w[i], g[i], a[i], lr, eps)
            if _not_finite(w_new, a_new, a_new):
                return i
    return -1


@numba.njit(inline="always")
def _adam_new(w, g, m, v, lr, b1, b2, eps, c1, c2):  # m = b1 m + (1-b1) g; v = b2 v + (1-b2) g g
    one = np.float32(1.0)  # w -= lr (m / c1) / (sqrt(v / c2) + eps)
    m_new = b1 * m + (one - b1) * g
    v_new = b2 * v + (one - b2) * g * g
    return w - lr * (m_new / c1) / (np.sqrt(v_new / c2) + eps), m_new, v_new


@numba.njit(nogil=True, error_model="numpy", cache=True)
def _adam_step(w, g, m, v, lr, b1, b2, eps, c1, c2, commit):
    if commit:
        for i in range(w.shape[0]):
            w[i], m[i], v[i] = _adam_new(w[i], g[i], m[i], v[i], lr, b1, b2, eps, c1, c2)
        return -1
    bad = 0
    for i in range(w.shape[0]):
        w_new, m_new, v_new = _adam_new(w[i], g[i], m[i], v[i], lr, b1, b2, eps, c1, c2)
        bad += _not_finite(w_new, m_new, v_new)
    if bad:
        for i in range(w.shape[0]):
            w_new, m_new, v_new = _adam_new(w[i], g[i], m[i], v[i], lr, b1, b2, eps, c1, c2)
            if _not_finite(w_new, m_new, v_new):
                return i
    return -1
