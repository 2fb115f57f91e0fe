"""Server-side optimizers: the optimizer-state part of a row and compiled update loops over a batch of rows.

A stored row is `[embedding (dim) | optimizer state (state_floats(dim))]`, float32. Each kernel updates a
contiguous block of rows in place, touching only its first dim + state columns; ps.rows.update runs them on
each block of a push while the block is in cache.

    sgd:      w -= lr * g
    adagrad:  a += g*g;  w -= lr * g / (sqrt(a) + epsilon)       state: a (dim floats), starts at initial_accumulator
    adagrad_rowwise:  a += mean_j(g_j^2);  w -= lr * g / (sqrt(a) + epsilon)
              state: a (1 float per row), starts at initial_accumulator (TorchRec/FBGEMM's rowwise Adagrad: the
              row shares one step size, for dim - 1 fewer floats per row than adagrad)
    adam:     t += 1; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
              state: m (dim), v (dim), t (1): the bias correction uses each id's own update count
    ftrl:     sigma = (sqrt(n + g^2) - sqrt(n)) / lr; z += g - sigma w; n += g^2;
              w = 0 if |z| <= l1 else -(z - sign(z) l1) / ((beta + sqrt(n)) / lr + l2)      state: z (dim), n (dim)
              Since w is a function of (z, n), an embedding set from outside the optimizer (an add-delta push)
              lasts only if z is set to match: ftrl_match_state solves the line above for z (w = 0: z kept if
              |z| <= l1, else moved to sign(z) l1; w != 0: z = -w ((beta + sqrt(n)) / lr + l2) - sign(w) l1)

The kernels compute in float32 with numpy's error model: a division by zero gives an Inf or NaN, never an
exception, so a result that is not finite is found by ps.rows.update's check and the push refused whole.
"""

from __future__ import annotations

import numba
import numpy as np

from ps.config import FTRL_TINY_GRADIENT, OptimizerConfig, ftrl_divides_by_zero


@numba.njit(nogil=True, fastmath=True, error_model="numpy", cache=True)
def _sgd(buf, grads, lr):
    n, dim = grads.shape
    for i in range(n):
        for j in range(dim):
            buf[i, j] -= lr * grads[i, j]


@numba.njit(nogil=True, fastmath=True, error_model="numpy", cache=True)
def _adagrad(buf, grads, lr, eps):
    """Two loops per row (accumulate, then step) so LLVM vectorizes the sqrt and division, which one fused loop
    leaves scalar."""
    n, dim = grads.shape
    acc = np.empty(dim, np.float32)
    for i in range(n):
        for j in range(dim):
            g = grads[i, j]
            acc[j] = buf[i, dim + j] + g * g
        for j in range(dim):
            buf[i, dim + j] = acc[j]
            buf[i, j] -= lr * grads[i, j] / (np.sqrt(acc[j]) + eps)


@numba.njit(nogil=True, fastmath=True, error_model="numpy", cache=True)
def _adagrad_rowwise(buf, grads, lr, eps):
    n, dim = grads.shape
    inv_dim = np.float32(1.0) / np.float32(dim)
    for i in range(n):
        sum_sq = np.float32(0.0)
        for j in range(dim):
            g = grads[i, j]
            sum_sq += g * g
        acc = buf[i, dim] + sum_sq * inv_dim
        buf[i, dim] = acc
        step = lr / (np.sqrt(acc) + eps)
        for j in range(dim):
            buf[i, j] -= step * grads[i, j]


@numba.njit(nogil=True, fastmath=True, error_model="numpy", cache=True)
def _adam(buf, grads, lr, b1, b2, eps):
    n, dim = grads.shape
    t_col = 3 * dim
    for i in range(n):
        t = buf[i, t_col] + np.float32(1.0)
        buf[i, t_col] = t
        c1 = np.float32(1.0) - b1**t  # bias corrections by this id's own update count
        c2 = np.float32(1.0) - b2**t
        for j in range(dim):
            g = grads[i, j]
            m = b1 * buf[i, dim + j] + (np.float32(1.0) - b1) * g
            v = b2 * buf[i, 2 * dim + j] + (np.float32(1.0) - b2) * g * g
            buf[i, dim + j] = m
            buf[i, 2 * dim + j] = v
            buf[i, j] -= lr * (m / c1) / (np.sqrt(v / c2) + eps)


@numba.njit(nogil=True, fastmath=True, error_model="numpy", cache=True)
def _ftrl(buf, grads, alpha, beta, l1, l2):
    n, dim = grads.shape
    for i in range(n):
        for j in range(dim):
            g = grads[i, j]
            z = buf[i, dim + j]
            acc = buf[i, 2 * dim + j]
            acc_new = acc + g * g
            sigma = (np.sqrt(acc_new) - np.sqrt(acc)) / alpha
            z += g - sigma * buf[i, j]
            buf[i, dim + j] = z
            buf[i, 2 * dim + j] = acc_new
            if abs(z) <= l1:
                buf[i, j] = np.float32(0.0)
            else:
                sign = np.float32(1.0) if z > 0 else np.float32(-1.0)
                buf[i, j] = -(z - sign * l1) / ((beta + np.sqrt(acc_new)) / alpha + l2)


@numba.njit(nogil=True, fastmath=True, error_model="numpy", cache=True)
def ftrl_match_state(buf: np.ndarray, dim: int, alpha: float, beta: float, l1: float, l2: float) -> None:
    """FTRL rows whose embeddings were set from outside the optimizer: each z set so that the optimizer's w of
    (z, n) is the embedding (the inverse in the module docstring), n left as it is."""
    for i in range(buf.shape[0]):
        for j in range(dim):
            w = buf[i, j]
            z = buf[i, dim + j]
            if w == 0:
                if abs(z) > l1:
                    buf[i, dim + j] = l1 if z > 0 else -l1
            else:
                sign = np.float32(1.0) if w > 0 else np.float32(-1.0)
                buf[i, dim + j] = -w * ((beta + np.sqrt(buf[i, 2 * dim + j])) / alpha + l2) - sign * l1


# kernel codes: apply_kernel picks the loop, so callers compile once
SGD, ADAGRAD, ADAM, FTRL, ADAGRAD_ROWWISE = range(5)


@numba.njit(nogil=True, cache=True)
def apply_kernel(code: int, buf: np.ndarray, grads: np.ndarray, p: np.ndarray) -> None:
    """One step of optimizer `code` with parameters p (float32: the learning rate, then KERNEL_PARAMS in order;
    entries past those are ignored) in place on a contiguous (n, width) buffer of rows. Callable from other
    compiled loops (ps.rows.update runs it per block of rows)."""
    if code == SGD:
        _sgd(buf, grads, p[0])
    elif code == ADAGRAD:
        _adagrad(buf, grads, p[0], p[1])
    elif code == ADAM:
        _adam(buf, grads, p[0], p[1], p[2], p[3])
    elif code == FTRL:
        _ftrl(buf, grads, p[0], p[1], p[2], p[3])
    else:
        _adagrad_rowwise(buf, grads, p[0], p[1])


class Optimizer:
    """One table's optimizer. Subclasses define CODE (their kernel), KERNEL_PARAMS (the parameters the kernel
    takes after the learning rate, in order) and their state floats per row."""

    name = ""
    CODE = -1
    KERNEL_PARAMS: tuple[str, ...] = ()

    def __init__(self, cfg: OptimizerConfig):
        cfg.validate()
        self.given_params = cfg.all_params()
        self.lr = np.float32(cfg.learning_rate)
        self.params = {k: np.float32(v) for k, v in self.given_params.items()}
        self.kernel_params = np.array([self.lr, *(self.params[k] for k in self.KERNEL_PARAMS)], dtype=np.float32)

    STATE_PER_DIM = 0  # optimizer-state floats per embedding dim

    @classmethod
    def state_floats_for(cls, dim: int) -> int:
        return cls.STATE_PER_DIM * dim

    def state_floats(self, dim: int) -> int:
        return self.state_floats_for(dim)

    def init_state(self, rows: np.ndarray, dim: int) -> None:
        """Fill the state columns rows[:, dim:] of rows that are new to the table."""

    def apply(self, buf: np.ndarray, grads: np.ndarray) -> None:
        """One step, in place, on a contiguous (n, width) buffer of rows."""
        apply_kernel(self.CODE, buf, grads, self.kernel_params)

    def non_finite_cause(self, row: np.ndarray, grad: np.ndarray) -> str:
        """Why a step of `grad` on `row` (as it was before the step: embedding, then state) gives a value that is
        not finite, in words for the push's refusal: a float32 overflow, unless a subclass knows better."""
        return "float32 overflow"


class Sgd(Optimizer):
    name = "sgd"
    CODE = SGD


class Adagrad(Optimizer):
    name = "adagrad"
    CODE = ADAGRAD
    KERNEL_PARAMS = ("epsilon",)

    STATE_PER_DIM = 1

    def init_state(self, rows: np.ndarray, dim: int) -> None:
        rows[:, dim:] = self.params["initial_accumulator"]


class AdagradRowwise(Optimizer):
    """Adagrad with one accumulator per row (the mean over the row's dims of g^2), so one step size per row."""

    name = "adagrad_rowwise"
    CODE = ADAGRAD_ROWWISE
    KERNEL_PARAMS = ("epsilon",)

    @classmethod
    def state_floats_for(cls, dim: int) -> int:
        return 1

    def init_state(self, rows: np.ndarray, dim: int) -> None:
        rows[:, dim:] = self.params["initial_accumulator"]


class Adam(Optimizer):
    """state: m (dim), v (dim), t (1: this id's update count, for its bias correction)."""

    name = "adam"
    CODE = ADAM
    KERNEL_PARAMS = ("beta1", "beta2", "epsilon")

    @classmethod
    def state_floats_for(cls, dim: int) -> int:
        return 2 * dim + 1

    def init_state(self, rows: np.ndarray, dim: int) -> None:
        rows[:, dim:] = 0.0


class Ftrl(Optimizer):
    """FTRL-Proximal (McMahan et al. 2013), per coordinate. state: z (dim), n (dim); the embedding holds the
    weights w derived from them. learning_rate is alpha. A new row's z is set so that w starts at its initial
    value: z = -w (beta / alpha + l2) - sign(w) l1."""

    name = "ftrl"
    CODE = FTRL
    KERNEL_PARAMS = ("beta", "l1", "l2")
    STATE_PER_DIM = 2

    def init_state(self, rows: np.ndarray, dim: int) -> None:
        w = rows[:, :dim].astype(np.float64)
        p = self.given_params
        rows[:, dim : 2 * dim] = -w * (p["beta"] / float(self.lr) + p["l2"]) - np.sign(w) * p["l1"]
        rows[:, 2 * dim : 3 * dim] = 0.0

    def non_finite_cause(self, row: np.ndarray, grad: np.ndarray) -> str:
        """With beta 0 and l2 0, w's divisor (beta + sqrt(n)) / alpha + l2 is 0 at a dim whose n is 0 and whose
        gradient squares to 0 in float32 (0 < |g| <= FTRL_TINY_GRADIENT): that dim is named; else an overflow."""
        dim = len(grad)
        g = np.asarray(grad, np.float32)
        zero = (row[2 * dim : 3 * dim] == 0) & (g != 0) & (np.abs(g) <= FTRL_TINY_GRADIENT)
        if self.params["beta"] != 0 or self.params["l2"] != 0 or not zero.any():
            return super().non_finite_cause(row, grad)
        j = int(np.flatnonzero(zero)[0])
        return ftrl_divides_by_zero(
            f"dim {j}: its n is 0 and its gradient {float(g[j]):g} squares to 0 in float32 (|g| <= "
            f"{FTRL_TINY_GRADIENT:.2g})",
            whose="the table's ",
        )


OPTIMIZERS = {cls.name: cls for cls in (Sgd, Adagrad, AdagradRowwise, Adam, Ftrl)}


def get_optimizer(cfg: OptimizerConfig) -> Optimizer:
    """The Optimizer for an OptimizerConfig; InvalidArgumentError for unknown names or parameters."""
    cfg.validate()
    return OPTIMIZERS[cfg.name](cfg)
