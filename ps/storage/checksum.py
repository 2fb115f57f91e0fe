"""checksum64: the journal's 64-bit record checksum, computed in compiled code on every core; and
copy_with_checksum64, an optional acceleration that copies the buffers in the same pass.

copy_with_checksum64 is optional: correctness never depends on it. Correctness needs of it that its result equal
checksum64 of the same buffers and that the copy be exact (tests/test_journal.py compares both, on the one-thread
and the parallel path); then a record written through it is byte for byte the record written by checksum64 and
pwritev. The journal calls it only for appends into its mapped segment (ps.accel.filemap); wherever the segment
is not mapped, it computes checksum64 and writes with pwritev.

checksum64 is part of the journal's format. The buffers are cut into CHUNK-byte chunks, each chunk is hashed
with four independent multiply-xor lanes over its 8-byte words (tail bytes zero-padded, the chunk's length mixed
in), and the chunk hashes are folded in order: the result depends only on the bytes and the buffers'
boundaries, not on how many threads computed it. It detects torn and corrupted records (a random change passes
with probability ~2**-64); it is not a cryptographic hash. It runs at memory speed and splits over threads, so
the checksum of a push record stays a small part of the push.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from ps.hashing import mix64_scalar
from ps.rows import parallel

CHUNK = 1 << 20
_NO_COPY = np.empty(0, dtype=np.uint8)
PARALLEL_BYTES = 2 << 20  # smaller records are hashed on the calling thread in one pass: a thread hand-off and the
# planning arrays cost more than they save (most records of a training step are far smaller)
_P = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier (golden ratio): each lane step is a bijection of the state


@numba.njit(nogil=True, cache=True)
def _chunk_hash(b, lo, hi, dest, d):
    """Hash of the bytes b[lo:hi] (b: contiguous uint8); if dest is not empty, also copies them to dest[d:] in
    the same loop (one pass over memory, not two)."""
    n = hi - lo
    words = n // 8
    h0 = np.uint64(0x243F6A8885A308D3)
    h1 = np.uint64(0x13198A2E03707344)
    h2 = np.uint64(0xA4093822299F31D0)
    h3 = np.uint64(0x082EFA98EC4E6C89)
    w = b[lo : lo + words * 8].view(np.uint64)
    full = words - words % 4
    if dest.shape[0] > 0:
        out = dest[d : d + words * 8].view(np.uint64)
        for i in range(0, full, 4):
            x0, x1, x2, x3 = w[i], w[i + 1], w[i + 2], w[i + 3]
            out[i], out[i + 1], out[i + 2], out[i + 3] = x0, x1, x2, x3
            h0 = (h0 ^ x0) * _P
            h1 = (h1 ^ x1) * _P
            h2 = (h2 ^ x2) * _P
            h3 = (h3 ^ x3) * _P
        for x in range(lo + 8 * full, hi):
            dest[d - lo + x] = b[x]
    else:
        for i in range(0, full, 4):
            h0 = (h0 ^ w[i]) * _P
            h1 = (h1 ^ w[i + 1]) * _P
            h2 = (h2 ^ w[i + 2]) * _P
            h3 = (h3 ^ w[i + 3]) * _P
    for i in range(full, words):
        h0 = (h0 ^ w[i]) * _P
    tail = np.uint64(0)
    for i in range(lo + words * 8, hi):
        tail = (tail << np.uint64(8)) | np.uint64(b[i])
    h = mix64_scalar(h0) ^ mix64_scalar(h1 + _P) ^ mix64_scalar(h2 + np.uint64(2) * _P)
    h ^= mix64_scalar(h3 + np.uint64(3) * _P)
    return mix64_scalar(h ^ mix64_scalar(tail ^ np.uint64(n)))


@numba.njit(nogil=True, cache=True)
def _hash_chunks(b, starts, out, first, last, dest):
    """out[k] = hash of chunk k of b (chunk k is b[starts[k]:starts[k + 1]]) for k in [first, last), copying
    the chunks to dest (same offsets) if dest is not empty."""
    for k in range(first, last):
        out[k] = _chunk_hash(b, starts[k], starts[k + 1], dest, starts[k])


def checksum64(buffers: Sequence[bytes | memoryview | np.ndarray]) -> int:
    """The checksum of the bytes of buffers (bytes-like objects) and of where one ends and the next begins."""
    return copy_with_checksum64(buffers, 0, None)


def copy_with_checksum64(buffers: Sequence[bytes | memoryview | np.ndarray], skip: int, dest: np.ndarray | None) -> int:
    """checksum64(buffers), copying buffers[skip:] one after another into dest (uint8, exactly their total
    length) in the same pass over memory; buffers[:skip] are only hashed. dest None: no copy. Optional: it must
    equal checksum64 and copy exactly; where a caller has no such dest, checksum64 and a write do the same."""
    arrays = [_bytes_of(x) for x in buffers]
    copies = [_NO_COPY] * len(arrays)
    if dest is not None:
        ends = np.cumsum([0] + [len(a) for a in arrays[skip:]])
        if ends[-1] != len(dest):
            raise ValueError(f"copy_with_checksum64: {ends[-1]} bytes to copy into {len(dest)}")
        for k in range(skip, len(arrays)):
            copies[k] = dest[ends[k - skip] : ends[k + 1 - skip]]
    if sum(len(a) for a in arrays) < PARALLEL_BYTES:  # one thread, and no planning arrays (their set-up cost
        h = np.uint64(_fold_value(np.uint64(0), np.uint64(len(arrays))))  # more than the hashing of a small
        for a, c in zip(
            arrays, copies
        ):  # record); numba hands back a Python int, so the state goes back as a uint64 each time
            h = np.uint64(_fold_buffer(h, a, c))
        return int(mix64_scalar(h))
    plans = []
    for a, c in zip(arrays, copies):
        starts = np.arange(0, len(a) + CHUNK, CHUNK, dtype=np.int64)
        starts[-1] = len(a)
        plans.append((a, starts, np.empty(len(starts) - 1, dtype=np.uint64), c))
    work = [(a, starts, out, c, k) for a, starts, out, c in plans for k in range(len(out))]
    groups = min(len(work), parallel.THREADS)
    bounds = [len(work) * g // max(1, groups) for g in range(groups + 1)]

    def part(g: int) -> None:
        for a, starts, out, c, k in work[bounds[g] : bounds[g + 1]]:
            _hash_chunks(a, starts, out, k, k + 1, c)

    if groups:
        parallel.run_each(part, groups)
    sequence = [np.array([len(arrays)], dtype=np.uint64)]  # each buffer: its chunk hashes, then their count
    for _, _, out, _ in plans:
        sequence += [out, np.array([len(out)], dtype=np.uint64)]
    return int(_fold(np.concatenate(sequence)))


@numba.njit(nogil=True, cache=True)
def _fold_value(h, x):
    return mix64_scalar(h ^ x) * _P


@numba.njit(nogil=True, cache=True)
def _fold_buffer(h, b, dest):
    """h folded with the chunk hashes of b and then their count: what _fold does with them, one buffer at a time
    (copying b to dest on the way, if dest is not empty)."""
    n = b.shape[0]
    count = 0
    for lo in range(0, n, CHUNK):
        h = mix64_scalar(h ^ _chunk_hash(b, lo, min(n, lo + CHUNK), dest, lo)) * _P
        count += 1
    return mix64_scalar(h ^ np.uint64(count)) * _P


@numba.njit(nogil=True, cache=True)
def _fold(hashes):
    h = np.uint64(0)
    for k in range(hashes.shape[0]):
        h = mix64_scalar(h ^ hashes[k]) * _P
    return mix64_scalar(h)


def _bytes_of(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    return np.frombuffer(x, dtype=np.uint8)
