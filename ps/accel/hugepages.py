"""Large arrays on transparent huge pages, for the tables the hot path reads at random (arena rows, id index).

A lookup or a row update at a random place of a 100 MB+ array misses the TLB nearly every time; with 2 MB pages
the same array needs 512x fewer TLB entries. Measured here (benchmarks/pull_push.py's access pattern, 100,000
random rows of 168 bytes out of 2M): a gather took 3.7 ms on huge pages against 4.3-4.5 ms on 4 KB pages, and a
row update 21 against 25 ms (one thread).

Linux only grants huge pages to memory that asks for them when transparent_hugepage is in `madvise` mode (the
default of many distributions, and this project's machines); elsewhere, or for small arrays, this is np.zeros.
The memory is anonymous, private and zero-filled; pages still cost RAM only once touched (2 MB at a time).
"""

from __future__ import annotations

import mmap

import numpy as np

MIN_BYTES = 4 << 20  # smaller arrays: plain numpy (a huge page would be mostly empty)


def zeros(shape, dtype) -> np.ndarray:
    """A zero-filled array of shape and dtype, on huge pages where the OS grants them."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < MIN_BYTES or advise is None:
        return np.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(advise)
    except OSError:  # a kernel without transparent huge pages: ordinary pages
        pass
    return np.frombuffer(buf, dtype=dtype).reshape(shape)  # the array keeps buf (and so the mapping) alive
