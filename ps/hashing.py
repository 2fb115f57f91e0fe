"""mix64: the house-wide 64-bit mixing hash (the splitmix64 finalizer), in numpy and for compiled loops.

Everything that must agree across processes and restarts derives from it: the slot of an id (ps.sharding),
initial row values (ps.rows.initializers), probabilistic admission, the journal's checksum, the index's probe
sequence and the worker's feature ids. Changing it changes where every stored row lives: never change it.
"""

from __future__ import annotations

import numba
import numpy as np

_U64 = np.uint64


def mix64(ids: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, vectorized: a bijection on uint64 that spreads nearby ids over all bits."""
    z = np.asarray(ids, dtype=_U64).copy()
    with np.errstate(over="ignore"):
        z ^= z >> _U64(30)
        z *= _U64(0xBF58476D1CE4E5B9)
        z ^= z >> _U64(27)
        z *= _U64(0x94D049BB133111EB)
        z ^= z >> _U64(31)
    return z


@numba.njit(inline="always")
def mix64_scalar(z: np.uint64) -> np.uint64:
    """mix64 of one uint64, for compiled loops (same function as `mix64`)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
