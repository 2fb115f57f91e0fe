"""A compiled check of the float32 gradients of a push: the first value that is not finite.

np.isfinite(grads).all() allocates a mask as large as the push and needs a second pass to find the row; this reads
the values once as uint32 and counts exponent fields of all ones (Inf or NaN) in a loop LLVM vectorizes, then
looks for the first one only if there is one.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def _count_non_finite(bits):
    count = 0
    for i in range(bits.shape[0]):  # branch-free (vectorized; a max-reduction or a per-block early exit was slower)
        count += (bits[i] & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    return count


@numba.njit(nogil=True, cache=True)
def first_non_finite_bits(bits: np.ndarray) -> int:
    """Index of the first Inf or NaN in float32 values viewed as 1-D uint32 bits, or -1 (compiled callers)."""
    if _count_non_finite(bits) == 0:
        return -1
    for i in range(bits.shape[0]):
        if bits[i] & np.uint32(0x7F800000) == np.uint32(0x7F800000):
            return i
    return -1


def first_non_finite(a: np.ndarray) -> int:
    """Flat index of the first Inf or NaN in a float32 array, or -1."""
    flat = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    return int(first_non_finite_bits(flat.view(np.uint32)))
