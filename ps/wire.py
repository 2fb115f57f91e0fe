"""Bytes <-> ndarray for the arrays that travel in bytes fields (ps/codec.py reads and writes the messages).

ids travel as little-endian uint64 (`<u8`), rows and grads as little-endian float32 (`<f4`), C order.
Decoders check lengths and say what was expected and what arrived; they return read-only views (no copy).
"""

from __future__ import annotations

import numpy as np

from ps.errors import InvalidArgumentError

IDS_DTYPE = np.dtype("<u8")
ROWS_DTYPE = np.dtype("<f4")


def encode_ids(ids: np.ndarray) -> bytes:
    return np.ascontiguousarray(ids, dtype=IDS_DTYPE).tobytes()


def encode_rows(rows: np.ndarray) -> bytes:
    return np.ascontiguousarray(rows, dtype=ROWS_DTYPE).tobytes()


def strictly_increasing(ids: np.ndarray) -> bool:
    """True if every id is larger than the one before (so none repeats); checked without sorting."""
    return len(ids) < 2 or bool((ids[1:] > ids[:-1]).all())


def repeats_ids(ids: np.ndarray) -> bool:
    """True if an id occurs twice (strictly increasing ids, the common case, are checked without sorting)."""
    return not strictly_increasing(ids) and len(np.unique(ids)) != len(ids)


def decode_ids(data: bytes, field: str = "ids") -> np.ndarray:
    """uint64 ids from bytes; InvalidArgumentError if the length is not a multiple of 8."""
    if len(data) % IDS_DTYPE.itemsize:
        raise InvalidArgumentError(
            f"{field} has {len(data)} bytes, expected a multiple of 8 (little-endian uint64 ids)"
        )
    return np.frombuffer(data, dtype=IDS_DTYPE)


def decode_rows(data: bytes, n: int, dim: int, field: str = "rows") -> np.ndarray:
    """(n, dim) float32 from bytes; InvalidArgumentError if the length is not 4 * n * dim."""
    expected = ROWS_DTYPE.itemsize * n * dim
    if len(data) != expected:
        raise InvalidArgumentError(
            f"{field} has {len(data)} bytes, expected 4*{n}*{dim} = {expected} (float32, {n} ids x dim {dim})"
        )
    return np.frombuffer(data, dtype=ROWS_DTYPE).reshape(n, dim)
