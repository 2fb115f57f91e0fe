"""Large arrays on transparent huge pages, for the tables the hot path reads at random (arena rows, id index).

Optional: correctness never depends on it. zeros() always returns a zero-filled, writable, C-contiguous array of
the shape and dtype asked for, like np.zeros; resize() always leaves the rows it was given followed by zero rows. Where
Python has no MADV_HUGEPAGE (not Linux), and for arrays under MIN_BYTES, it is np.zeros; where the kernel refuses the
advice (no transparent huge pages), it is an anonymous mapping on ordinary pages; where transparent_hugepage is `never`,
the advice is accepted and ignored. Only the number of TLB misses differs.

Why: a lookup or a row update at a random place of an array of hundreds of MB misses the TLB nearly every time
on 4 KB pages; on 2 MB pages the same array needs 512 times fewer TLB entries. Linux grants huge pages to memory
that asks for them (MADV_HUGEPAGE) when transparent_hugepage is in `madvise` mode (the default of many
distributions) or `always`. The memory is anonymous, private and zero-filled; its pages cost RAM only once
touched (2 MB at a time). resize() grows or shrinks such a mapping in place where the OS can (mremap, through
mmap.resize): the pages move instead of being copied, so a growing table never holds its rows twice; anywhere
else, or while another array still views the mapping, it copies.
"""

from __future__ import annotations

import mmap

import numpy as np
from numpy.typing import DTypeLike

MIN_BYTES = 4 << 20  # smaller arrays: plain numpy (a huge page would be mostly empty)


def zeros(shape: int | tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
    """A zero-filled array of shape and dtype, on huge pages where the OS grants them."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < MIN_BYTES or advise is None:
        return np.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(advise)
    except OSError:  # the kernel refuses the advice (no transparent huge pages): ordinary pages
        pass
    return np.frombuffer(buf, dtype=dtype).reshape(shape)  # the array keeps buf (and so the mapping) alive


def _mapping(a: np.ndarray) -> mmap.mmap | None:
    """The mapping zeros() put a on, or None (np.zeros)."""
    base = a.base
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer views the mapping through a memoryview
        base = base.obj
    return base if isinstance(base, mmap.mmap) else None


def resize(owner: object, name: str, rows: int) -> None:
    """Replaces owner's array attribute `name` (one that zeros() or resize() made) by an array of `rows` rows, its
    shape otherwise, holding its first min(old rows, rows) rows, then zeros. The attribute holds the array's only
    reference, and nothing views it (drop the views first), so that its mapping can be resized in place; where
    something still views it, or the OS cannot resize mappings, the rows are copied instead. Where that copy gets no
    memory (MemoryError, OSError), the attribute is left as it was and the error propagates."""
    a = vars(owner).pop(name)
    shape = (rows, *a.shape[1:])
    dtype, old_shape = a.dtype, a.shape
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = _mapping(a)
    if buf is not None and nbytes >= MIN_BYTES:
        del a  # the attribute's reference was the last one: the mapping is no longer viewed
        try:
            buf.resize(nbytes)
        except (BufferError, OSError, SystemError, ValueError):  # still viewed, or no mremap: copy below
            a = np.frombuffer(buf, dtype=dtype).reshape(old_shape)
        else:
            setattr(owner, name, np.frombuffer(buf, dtype=dtype).reshape(shape))
            return
    try:
        out = zeros(shape, dtype)
    except BaseException:
        setattr(owner, name, a)
        raise
    keep = min(rows, old_shape[0])
    out[:keep] = a[:keep]
    setattr(owner, name, out)


def release(a: np.ndarray, start: int) -> None:
    """Gives the RAM of rows [start, len(a)) of an array that zeros() or resize() made back to the OS, where the
    array is a mapping of its own (MADV_DONTNEED): the whole pages in those rows read as zeros after, and cost RAM
    again once written. Optional: the caller keeps nothing in those rows either way; without it (np.zeros, no
    MADV_DONTNEED) pages once written stay resident until the array resizes. OSError where the kernel refuses."""
    buf = _mapping(a)
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if buf is None or advice is None or a.nbytes != len(buf) or not a.flags.c_contiguous:  # not all of its mapping
        return
    first = -(-start * a.strides[0] // mmap.PAGESIZE) * mmap.PAGESIZE
    if first < len(buf):
        buf.madvise(advice, first, len(buf) - first)
