"""Initial values of rows never pushed: a pure function of (seed, id, column), so no row needs storing to be pulled.

h(seed, id, j) = splitmix64 of (id * K1 + seed * K2 + j * K3); u = top 24 bits of h / 2**24 in [0, 1)
uniform: (2u - 1) * scale          normal: Box-Muller over two such uniforms, times scale
"""

from __future__ import annotations

import numba
import numpy as np

from ps.config import InitializerConfig
from ps.hashing import mix64_scalar as _mix

_KIND = {"zeros": 0, "uniform": 1, "normal": 2}


@numba.njit(inline="always")
def _unit(h):
    return np.float32(h >> np.uint64(40)) * np.float32(1.0 / 16777216.0)


@numba.njit(nogil=True, cache=True)
def _init_rows(ids, out, dim, kind, scale, seed):
    n = ids.shape[0]
    for i in range(n):
        base = ids[i] * np.uint64(0x9E3779B97F4A7C15) + seed * np.uint64(0xD1B54A32D192ED03)
        for j in range(dim):
            if kind == 0:
                out[i, j] = np.float32(0.0)
                continue
            h = _mix(base + np.uint64(j) * np.uint64(0xA0761D6478BD642F) + np.uint64(0x632BE59BD9B4E019))
            u = _unit(h)
            if kind == 1:
                out[i, j] = (np.float32(2.0) * u - np.float32(1.0)) * scale
            else:
                u1 = np.float32(1.0) - u  # in (0, 1]
                u2 = _unit(_mix(h))
                r = np.sqrt(np.float32(-2.0) * np.log(u1))
                out[i, j] = r * np.cos(np.float32(6.283185307179586) * u2) * scale


def init_rows(cfg: InitializerConfig, ids: np.ndarray, out: np.ndarray, dim: int) -> None:
    """Writes the initial embedding of each id into out[:, :dim] (out may be wider: the state columns stay)."""
    _init_rows(
        np.ascontiguousarray(ids, dtype=np.uint64),
        out,
        dim,
        _KIND[cfg.name],
        np.float32(cfg.scale),
        np.uint64(cfg.seed),
    )
