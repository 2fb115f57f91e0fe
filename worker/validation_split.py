"""The validation split of a worker's share of the data: which examples it takes, and about how many.

The split: the k-th example of this worker's share (counting good examples from 0, in file order) is a
validation example when mix64(k ^ VALIDATION_SALT) < fraction * 2**64, up to max_validation of them: later picks
train (the validation set is held in memory, and more would not change its figures much). The same examples are
picked on every pass, and training never sees them (worker/data.py's DataSource reads the share through it).
"""

from __future__ import annotations

import numpy as np

from ps.hashing import mix64

VALIDATION_SALT = np.uint64(0x5EED_0F_5A11D)
DEFAULT_MAX_VALIDATION = 200_000


def held_out(examples: int, fraction: float, max_validation: int) -> int:
    """The examples of `examples` that a validation split of `fraction` takes, as an estimate (its picks are by a
    hash: the module docstring): at most max_validation, whose later picks train."""
    return min(examples - int(examples * (1 - fraction)), max_validation)


def validation_mask(first: int, n: int, fraction: float) -> np.ndarray:
    """Which of the examples first..first+n-1 of a share the split selects (see the module docstring)."""
    if fraction <= 0:
        return np.zeros(n, dtype=bool)
    k = np.arange(first, first + n, dtype=np.uint64)
    threshold = np.uint64(min(int(fraction * 2.0**64), 2**64 - 1))
    return mix64(k ^ VALIDATION_SALT) < threshold
