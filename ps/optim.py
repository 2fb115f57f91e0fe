"""Server-side optimizers: the optimizer-state part of a row and compiled update loops over a batch of rows.

A stored row is `[embedding (dim) | optimizer state (state_floats(dim))]`, float32. `step` reads rows
data[rows[i]] and writes their updated values to a new (n, width) buffer (gather, update in place, finiteness
check), so the table changes only when the caller scatters the buffer back.

    sgd:      w -= lr * g
    adagrad:  a += g*g;  w -= lr * g / (sqrt(a) + epsilon)       state: a (dim floats), starts at initial_accumulator
"""

from __future__ import annotations

import numba
import numpy as np

from ps.config import MAX_HYPERPARAMETER, check_hyperparameter
from ps.errors import InvalidArgumentError
from ps.rowcopy import gather


@numba.njit(nogil=True, cache=True)
def first_nonfinite_row(bits):
    """First row of a float32 buffer, viewed as uint32, holding an Inf or NaN (all exponent bits set), or -1.
    Integer bit tests: fast-math in the update loops may not drop them."""
    for i in range(bits.shape[0]):
        for j in range(bits.shape[1]):
            if bits[i, j] & np.uint32(0x7F800000) == np.uint32(0x7F800000):
                return i
    return -1


@numba.njit(nogil=True, fastmath=True, cache=True)
def _sgd(buf, grads, lr):
    n, dim = grads.shape
    for i in range(n):
        for j in range(dim):
            buf[i, j] -= lr * grads[i, j]


@numba.njit(nogil=True, fastmath=True, cache=True)
def _adagrad(buf, grads, lr, eps):
    n, dim = grads.shape
    for i in range(n):
        for j in range(dim):
            g = grads[i, j]
            a = buf[i, dim + j] + g * g
            buf[i, dim + j] = a
            buf[i, j] -= lr * g / (np.sqrt(a) + eps)


class Optimizer:
    """One table's optimizer. Subclasses define DEFAULTS (their parameter names), state_floats and apply."""

    name = ""
    DEFAULTS: dict[str, float] = {}

    def __init__(self, learning_rate: float, params: dict[str, float]):
        unknown = sorted(set(params) - set(self.DEFAULTS))
        if unknown:
            raise InvalidArgumentError(
                f"optimizer {self.name!r} got unknown parameters {unknown}; expected some of {sorted(self.DEFAULTS)}"
            )
        merged = {**self.DEFAULTS, **params}
        for k, v in merged.items():
            check_hyperparameter(f"optimizer {self.name!r} parameter {k}", v, low=-MAX_HYPERPARAMETER)
        self.given_params = {k: float(v) for k, v in merged.items()}
        self.lr = np.float32(learning_rate)
        self.params = {k: np.float32(v) for k, v in merged.items()}

    STATE_PER_DIM = 0  # optimizer-state floats per embedding dim

    @classmethod
    def state_floats_for(cls, dim: int) -> int:
        return cls.STATE_PER_DIM * dim

    def state_floats(self, dim: int) -> int:
        return self.state_floats_for(dim)

    def init_state(self, rows: np.ndarray, dim: int) -> None:
        """Fill the state columns rows[:, dim:] of rows that are new to the table."""

    def step(self, data: np.ndarray, rows: np.ndarray, grads: np.ndarray, out: np.ndarray) -> int:
        """out[i] = data[rows[i]] after one step with grads[i]; returns the first i whose result is not
        finite, or -1. Gather, then update the contiguous copy: two loops beat one fused loop 2x here."""
        gather(data, rows, out.shape[1], out)
        self.apply(out, grads)
        return first_nonfinite_row(out.view(np.uint32))

    def apply(self, buf: np.ndarray, grads: np.ndarray) -> None:
        """One step, in place, on a contiguous (n, width) buffer of rows."""
        raise NotImplementedError


class Sgd(Optimizer):
    name = "sgd"

    def apply(self, buf, grads) -> None:
        _sgd(buf, grads, self.lr)


class Adagrad(Optimizer):
    name = "adagrad"
    DEFAULTS = {"initial_accumulator": 0.1, "epsilon": 1e-7}

    def __init__(self, learning_rate: float, params: dict[str, float]):
        super().__init__(learning_rate, params)
        check_hyperparameter("adagrad initial_accumulator", self.given_params["initial_accumulator"])
        check_hyperparameter("adagrad epsilon", self.given_params["epsilon"], low_inclusive=False)

    STATE_PER_DIM = 1

    def init_state(self, rows: np.ndarray, dim: int) -> None:
        rows[:, dim:] = self.params["initial_accumulator"]

    def apply(self, buf, grads) -> None:
        _adagrad(buf, grads, self.lr, self.params["epsilon"])


OPTIMIZERS = {cls.name: cls for cls in (Sgd, Adagrad)}


def get_optimizer(cfg) -> Optimizer:
    """The Optimizer for an OptimizerConfig; InvalidArgumentError for unknown names or parameters."""
    cls = OPTIMIZERS.get(cfg.name)
    if cls is None:
        raise InvalidArgumentError(f"optimizer {cfg.name!r} is unknown; expected one of {sorted(OPTIMIZERS)}")
    return cls(cfg.learning_rate, dict(cfg.params))
