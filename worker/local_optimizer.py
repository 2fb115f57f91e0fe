"""The servers' optimizer rules (sgd, adagrad, adam) run on a worker over one flat float32 vector, bit for bit alike
on every worker: the update of the allreduce dense path (worker/allreduce.py), which each worker applies to the
group's mean gradient itself.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ps.config import OptimizerConfig
from ps.errors import NOTHING_APPLIED


class NonFiniteStepError(ValueError):
    """A step refused because it would make a weight, or its optimizer state, Inf or NaN; nothing of it was applied.
    index: the first such element of the vector; weight and grad: its weight before the step and its gradient;
    overflow: the kind, False where that gradient is Inf or NaN, True where it is finite and the step overflows
    float32. The message names the element by its index; say() names it as a caller knows it."""

    def __init__(self, optimizer: str, index: int, weight: float, grad: float):
        self.optimizer, self.index, self.weight, self.grad = optimizer, index, weight, grad
        self.overflow = math.isfinite(grad)
        super().__init__(self.say(f"element {index}"))

    def say(self, element: str, gradient: str = "gradient") -> str:
        """The refusal of the step at element (where it is), its gradient called gradient, and the outcome."""
        if not self.overflow:
            return f"the {gradient} at {element} is {self.grad} (weight {self.weight}); {NOTHING_APPLIED}"
        return (
            f"the {self.optimizer} step would make {element} or its optimizer state non-finite (weight {self.weight}, "
            f"{gradient} {self.grad}): float32 overflow; {NOTHING_APPLIED}"
        )


class LocalOptimizer:
    """ps.rows.optim's update (sgd, adagrad, adam) of one flat float32 vector: each element as the servers'
    kernels compute it, every operation a single IEEE-rounded float32 one (none fused or reordered), so equal
    inputs give equal bits on any machine. Adam's bias correction counts this optimizer's steps (each
    step updates every element, as a server counts each id's updates). As a server refuses a push that would make a
    row non-finite, a step that would make any weight or state element non-finite (an Inf or NaN gradient, or
    float32 overflow) is refused whole (NonFiniteStepError): weights, state and the step count as they were.
    A step keeps the weights before it, and writes the new state, into buffers of its own (one more vector per
    array: the weights, and Adagrad's accumulator or Adam's m and v): the new state takes the old one's place once
    the step is known to be finite, and the weights before are put back where it is not."""

    SUPPORTED = ("sgd", "adagrad", "adam")

    def __init__(self, cfg: OptimizerConfig, size: int):
        cfg.validate()
        if cfg.name not in self.SUPPORTED:
            raise ValueError(f"the allreduce dense path runs {list(self.SUPPORTED)}, not {cfg.name!r}")
        p = {k: np.float32(v) for k, v in cfg.all_params().items()}
        self.name, self.lr, self.params, self.steps = cfg.name, np.float32(cfg.learning_rate), p, 0
        self._before = np.empty(size, np.float32)  # the weights before a step, put back if it is refused
        if cfg.name == "adagrad":
            self.accumulator = np.full(size, p["initial_accumulator"], np.float32)
            self._accumulator = np.empty(size, np.float32)  # a step's new accumulator, swapped in once finite
        if cfg.name == "adam":
            self.m, self._m = np.zeros(size, np.float32), np.empty(size, np.float32)  # (likewise)
            self.v, self._v = np.zeros(size, np.float32), np.empty(size, np.float32)

    def apply(self, weights: np.ndarray, grads: np.ndarray) -> None:
        """One step on weights (float32, in place) with grads of the same shape, in one compiled pass: it writes
        the new weights in place, the weights before and the new state into the step's buffers, and tells whether
        any new weight or state element is not finite. None: the new state takes the old one's place; else the
        weights before are put back, and NonFiniteStepError names the first such element, nothing changed. A
        weights or grads not of the optimizer's size, (size,), is a ValueError, nothing changed (the kernels check
        no bounds)."""
        p, before = self.params, self._before
        if weights.shape != before.shape or grads.shape != before.shape:
            raise ValueError(
                f"weights have shape {weights.shape} and grads {grads.shape}, expected {before.shape} each (the size "
                "the optimizer was made for)"
            )
        if self.name == "sgd":
            bad = _sgd_step(weights, grads, self.lr, before)
        elif self.name == "adagrad":
            bad = _adagrad_step(weights, grads, self.accumulator, self.lr, p["epsilon"], before, self._accumulator)
        else:
            c1, c2 = self._adam_corrections(self.steps + 1)
            m, v, b1, b2 = self.m, self.v, p["beta1"], p["beta2"]
            bad = _adam_step(weights, grads, m, v, self.lr, b1, b2, p["epsilon"], c1, c2, before, self._m, self._v)
        if bad:
            error = self._refusal(weights, grads)
            np.copyto(weights, before)
            raise error
        self.steps += 1
        if self.name == "adagrad":
            self.accumulator, self._accumulator = self._accumulator, self.accumulator
        elif self.name == "adam":
            self.m, self._m, self.v, self._v = self._m, self.m, self._v, self.v

    def _refusal(self, weights: np.ndarray, grads: np.ndarray) -> NonFiniteStepError:
        """The error of a refused step (weights: the step's new ones): its first element whose new weight or state
        is not finite."""
        finite = np.isfinite(weights)
        for new in self._new_state():
            finite &= np.isfinite(new)
        i = int(np.flatnonzero(~finite)[0])
        return NonFiniteStepError(self.name, i, float(self._before[i]), float(grads[i]))

    def _new_state(self) -> tuple[np.ndarray, ...]:
        """The buffers a step writes its new state into: Adagrad's accumulator; Adam's m and v; none for sgd."""
        if self.name == "adagrad":
            return (self._accumulator,)
        if self.name == "adam":
            return self._m, self._v
        return ()

    def _adam_corrections(self, t: int) -> tuple[np.float32, np.float32]:
        """Adam's 1 - b1^t and 1 - b2^t, each rounded once, to float32."""
        p = self.params
        return np.float32(1.0 - float(p["beta1"]) ** t), np.float32(1.0 - float(p["beta2"]) ** t)


# Each rule's kernel is one pass over the vector: every operation a float32 one in the order written (no fastmath:
# nothing fused or reordered), so equal inputs give equal bits on every worker. error_model="numpy": a division is
# IEEE's (no check for a zero divisor, which none of these can be), so the loops vectorize. A kernel reads the
# weights, gradients and state; writes the weights before into w_before, the new weights in place, the new state
# into the out arrays; and returns whether any new weight or state element is not finite, found branch-free (a
# bool or-ed, not a count: an int64 count narrows the vectors to its width).
@numba.njit(inline="always")
def _not_finite(x, y, z):
    return (x - x) + (y - y) + (z - z) != 0  # NaN where any is Inf or NaN (Inf - Inf is NaN), else 0; branch-free


@numba.njit(nogil=True, error_model="numpy", cache=True)
def _sgd_step(w, g, lr, w_before):  # w -= lr g
    bad = False
    for i in range(w.shape[0]):
        w_new = w[i] - lr * g[i]
        w_before[i], w[i] = w[i], w_new
        bad |= _not_finite(w_new, w_new, w_new)
    return bad


@numba.njit(nogil=True, error_model="numpy", cache=True)
def _adagrad_step(w, g, a, lr, eps, w_before, a_out):  # a += g g; w -= lr g / (sqrt(a) + eps)
    bad = False
    for i in range(w.shape[0]):
        a_new = a[i] + g[i] * g[i]
        w_new = w[i] - lr * g[i] / (np.sqrt(a_new) + eps)
        w_before[i], w[i], a_out[i] = w[i], w_new, a_new
        bad |= _not_finite(w_new, a_new, a_new)
    return bad


@numba.njit(nogil=True, error_model="numpy", cache=True)
def _adam_step(w, g, m, v, lr, b1, b2, eps, c1, c2, w_before, m_out, v_out):
    one = np.float32(1.0)  # m = b1 m + (1-b1) g; v = b2 v + (1-b2) g g; w -= lr (m / c1) / (sqrt(v / c2) + eps)
    bad = False
    for i in range(w.shape[0]):
        m_new = b1 * m[i] + (one - b1) * g[i]
        v_new = b2 * v[i] + (one - b2) * g[i] * g[i]
        w_new = w[i] - lr * (m_new / c1) / (np.sqrt(v_new / c2) + eps)
        w_before[i], w[i], m_out[i], v_out[i] = w[i], w_new, m_new, v_new
        bad |= _not_finite(w_new, m_new, v_new)
    return bad
