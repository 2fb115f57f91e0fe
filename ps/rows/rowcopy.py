"""Compiled row copies between a table's arena and contiguous buffers (explicit inner loops: numba does not turn
row slices inside a compiled loop into plain copies)."""

from __future__ import annotations

import numba
import numpy as np

from ps.accel.prefetch import AHEAD, prefetch_row_for_write


@numba.njit(nogil=True, cache=True)
def gather(data: np.ndarray, rows: np.ndarray, cols: int, out: np.ndarray) -> None:
    """out[i, :cols] = data[rows[i], :cols]."""
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(cols):
            out[i, j] = data[r, j]


@numba.njit(nogil=True, cache=True)
def scatter(data: np.ndarray, rows: np.ndarray, buf: np.ndarray) -> None:
    """data[rows[i], :] = buf[i, :]."""
    width = buf.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(width):
            data[r, j] = buf[i, j]


@numba.njit(nogil=True, cache=True)
def gather_for_update(data: np.ndarray, rows: np.ndarray, lo: int, hi: int, cols: int, out: np.ndarray) -> None:
    """out[i - lo, :cols] = data[rows[i], :cols] for i in [lo, hi), prefetching the rows AHEAD places on (up to
    the end of rows) for writing: the caller updates these rows next."""
    n = rows.shape[0]
    for i in range(lo, hi):
        if i + AHEAD < n:
            prefetch_row_for_write(data, rows[i + AHEAD])
        r = rows[i]
        for j in range(cols):
            out[i - lo, j] = data[r, j]
