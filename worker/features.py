"""The Criteo schema and feature hashing: raw integer and categorical values -> uint64 ids, one per field.

Shared by the file reader (worker/criteo.py) and the synthetic generator (worker/synthetic.py), so both
produce the same ids for the same raw values. Contract:

    example   = label, I1..I13 (int64, MISSING_INT if absent), C1..C26 (uint64 raw value, MISSING_CAT if absent)
    field f   = 0..12 for I1..I13, 13..38 for C1..C26
    value     = int_bucket(I) for integer fields, the raw uint64 for categorical fields
    id        = mix64(mix64(value) ^ (f + 1) * 0x9E3779B97F4A7C15)        # mod 2**64
    ids row   = [id of field 0, ..., id of field 38, BIAS_ID]              # (NUM_FIELDS + 1,) uint64

Missing values are ordinary reserved values (INT_MISSING_BUCKET, MISSING_CAT), so each field has its own
"missing" id. The same raw value in two fields gives two different ids.

Categorical strings -> raw values (`cat_values`): a string of 1..16 hex digits is its number
(int(s, 16); case-insensitive); the empty string, and a blank one (whitespace only, `blank_strings`: str.isspace
of its text), is MISSING_CAT; any other string (and the one hex string
"ffffffffffffffff", whose number is reserved) is the little-endian 8-byte blake2b digest of its bytes as they
are in the file, in every format: a reader's text with bytes that are not UTF-8 (decoded as surrogate escapes)
hashes as those bytes, as a reader of bytes (Criteo's) hashes them. Strings pass through numpy str/bytes arrays,
which drop trailing NUL characters ("a\0" reads as "a").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numba
import numpy as np

from ps.hashing import mix64, mix64_scalar

NUM_INT_FIELDS = 13
NUM_CAT_FIELDS = 26
NUM_FIELDS = NUM_INT_FIELDS + NUM_CAT_FIELDS  # 39; the ids matrix has one more column, BIAS_ID

MISSING_INT = np.int64(np.iinfo(np.int64).min)  # raw integer feature absent (empty field in the file)
MISSING_CAT = np.uint64(2**64 - 1)  # raw categorical value absent (empty field in the file)
INT_MISSING_BUCKET = np.uint64(2**63)  # int_bucket(MISSING_INT); no present integer maps here

_U64 = np.uint64
_GOLDEN = 0x9E3779B97F4A7C15
# Per-field salts, plus one for the bias "field" NUM_FIELDS.
_FIELD_SALTS = (np.arange(1, NUM_FIELDS + 2, dtype=np.uint64) * _U64(_GOLDEN)).astype(np.uint64)
# First integer bucket above the small values 0, 1, 2.
_LARGE_OFFSET = 3


def dense_features(int_values: np.ndarray) -> np.ndarray:
    """float32 (n, 13): log(1 + x) of the integer features, x clipped at 0; 0 where missing."""
    x = np.where(int_values == MISSING_INT, 0, np.maximum(int_values, 0)).astype(np.float64)
    return np.log1p(x).astype(np.float32)


def int_bucket(values: np.ndarray) -> np.ndarray:
    """Discretize raw integer features (int64, any shape) into uint64 bucket values, elementwise.

    v <= 2 (negatives included) keeps its value, as the two's-complement uint64 (so -1 -> 2**64 - 1);
    v > 2 -> 3 + floor(ln(v)**2), which lies in [4, 3 + 1911] and so never meets a small value;
    MISSING_INT -> INT_MISSING_BUCKET (= 2**63, the two's complement of MISSING_INT).
    """
    v = np.asarray(values, dtype=np.int64)
    out = v.view(np.uint64).copy()
    large = v > 2
    if large.any():
        ln = np.log(v[large].astype(np.float64))
        out[large] = (_LARGE_OFFSET + np.floor(ln * ln)).astype(np.uint64)
    return out


def field_ids(field: int, values_u64: np.ndarray) -> np.ndarray:
    """Ids of the (bucketed or raw categorical) uint64 values of one field (0..NUM_FIELDS), any shape."""
    if not 0 <= field <= NUM_FIELDS:
        raise ValueError(f"field {field} out of range, expected 0..{NUM_FIELDS}")
    with np.errstate(over="ignore"):
        return mix64(mix64(values_u64) ^ _FIELD_SALTS[field])


BIAS_ID = field_ids(NUM_FIELDS, np.zeros(1, dtype=np.uint64))[0]  # carried by every example


def space_ids(space: int | Sequence[int], values_u64: np.ndarray) -> np.ndarray:
    """Hashed ids of uint64 values (any shape) in id space `space` (>= 0) of a schema: the field hash with salt
    index space, or space + 1 from NUM_FIELDS on (NUM_FIELDS is the bias's), so spaces 0..38 give field_ids of
    fields 0..38 and no space's ids meet BIAS_ID's salt. With m spaces, values of shape (m, ...): row r's in
    space[r]. Compiled: one pass over the values."""
    values = np.asarray(values_u64, dtype=np.uint64, order="C")
    spaces = np.asarray(space, dtype=np.int64)
    if spaces.ndim > 1 or (spaces.ndim == 1 and (values.ndim == 0 or len(values) != len(spaces))):
        raise ValueError(f"{spaces.shape} id spaces for values of shape {values.shape}: expected one, or one a row")
    if (spaces < 0).any():
        raise ValueError(f"id space {space}, expected >= 0")
    salts = (spaces + 1 + (spaces >= NUM_FIELDS)).astype(np.uint64).reshape(-1) * _U64(_GOLDEN)  # mod 2**64
    out = np.empty_like(values)
    per_row = values.size // len(salts) if len(salts) else 0
    _hash_rows(values.reshape(len(salts), per_row), salts, out.reshape(len(salts), per_row))
    return out


@numba.njit(nogil=True, cache=True)
def _hash_rows(values, salts, out):
    """out[r, i] = mix64(mix64(values[r, i]) ^ salts[r])."""
    for r in range(values.shape[0]):
        for i in range(values.shape[1]):
            out[r, i] = mix64_scalar(mix64_scalar(values[r, i]) ^ salts[r])


def example_ids(int_values: np.ndarray, cat_values: np.ndarray) -> np.ndarray:
    """The ids matrix of n examples: int_values int64 (n, 13), cat_values uint64 (n, 26) -> uint64 (n, 40)."""
    int_values = np.asarray(int_values, dtype=np.int64)
    cat_values = np.asarray(cat_values, dtype=np.uint64)
    n = len(int_values)
    if int_values.shape != (n, NUM_INT_FIELDS) or cat_values.shape != (n, NUM_CAT_FIELDS):
        raise ValueError(
            f"int_values {int_values.shape} and cat_values {cat_values.shape}, "
            f"expected ({n}, {NUM_INT_FIELDS}) and ({n}, {NUM_CAT_FIELDS})"
        )
    values = np.empty((n, NUM_FIELDS + 1), dtype=np.uint64)
    values[:, :NUM_INT_FIELDS] = int_bucket(int_values)
    values[:, NUM_INT_FIELDS:NUM_FIELDS] = cat_values
    values[:, NUM_FIELDS] = 0
    with np.errstate(over="ignore"):
        return mix64(mix64(values) ^ _FIELD_SALTS[None, :])


# ASCII code -> hex digit value, 255 for anything else (codes >= 128 are clipped to 127, also 255).
_HEX_LUT = np.full(128, 255, dtype=np.uint8)
for _digits, _base in (("0123456789", 0), ("abcdef", 10), ("ABCDEF", 10)):
    _HEX_LUT[[ord(c) for c in _digits]] = np.arange(_base, _base + len(_digits), dtype=np.uint8)


def _blake64(s: str | bytes) -> int:
    data = s if isinstance(s, bytes) else _raw_bytes(s)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _raw_bytes(text: str) -> bytes:
    """The bytes a cell's text was read from: its UTF-8, with each byte a reader found not UTF-8 (decoded as a
    surrogate escape, U+DC80..U+DCFF) as that byte. Text with another lone surrogate, which no reader makes, has
    no such bytes: its surrogates are taken as UTF-8 would write them."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def cat_values(strings: np.ndarray) -> np.ndarray:
    """Raw uint64 values of categorical strings (any shape; see the module docstring for the mapping).

    Takes str arrays, or bytes arrays (dtype S), which give the same values as their text read with
    errors="surrogateescape" (UTF-8 or not).
    Hex strings are parsed vectorized; only the distinct non-hex strings are hashed one by one in Python.
    """
    arr = np.asarray(strings)
    if arr.dtype.kind != "S":
        arr = arr.astype(np.str_)
    arr = np.ascontiguousarray(arr)
    flat = arr.reshape(-1)
    char_bytes = 1 if arr.dtype.kind == "S" else 4
    n, width = len(flat), arr.dtype.itemsize // char_bytes
    out = np.full(n, MISSING_CAT, dtype=np.uint64)
    if n == 0 or width == 0:
        return out.reshape(arr.shape)
    lengths = np.char.str_len(flat)  # numpy drops trailing NULs; embedded NULs count (and are not hex)
    w = min(width, 16)
    codes = flat.view(np.uint8 if char_bytes == 1 else np.uint32).reshape(n, width)
    nibbles = _HEX_LUT[np.minimum(np.ascontiguousarray(codes[:, :w].T), 127)]  # (w, n): contiguous per position
    value = np.zeros(n, dtype=np.uint64)
    bad = np.zeros(n, dtype=bool)
    for j in range(w):  # one pass per character position, at most 16
        inside = lengths > j
        bad |= inside & (nibbles[j] == 255)
        step = value << _U64(4)
        step |= nibbles[j]
        np.copyto(value, step, where=inside)
    is_hex = (lengths >= 1) & (lengths <= 16) & ~bad
    is_hex &= value != MISSING_CAT
    out[is_hex] = value[is_hex]
    other = ~is_hex & (lengths > 0)
    if other.any():
        uniq, inverse = np.unique(flat[other], return_inverse=True)
        hashed = np.fromiter((_blake64(s) for s in uniq.tolist()), dtype=np.uint64, count=len(uniq))
        hashed[blank_strings(uniq)] = MISSING_CAT
        out[other] = hashed[inverse.reshape(-1)]
    return out.reshape(arr.shape)


# byte -> whether it may be part of a blank bytes string: NUL (a bytes array's padding), ASCII whitespace
# (str.isspace's: \t..\r, \x1c..\x1f, space) and every byte >= 0x80 (of U+0085, U+00A0, U+3000, ... in UTF-8)
_BLANK_BYTE = np.zeros(256, dtype=bool)
_BLANK_BYTE[[0, *range(9, 14), *range(28, 33), *range(128, 256)]] = True


def blank_strings(strings: np.ndarray) -> np.ndarray:
    """bool, the shape of strings: where a string is blank, not empty and whitespace only: str.isspace of its text
    (a bytes string's text: its UTF-8, bytes that are not UTF-8 read as surrogate escapes, as cat_values reads it).
    What schema inference's str.strip() takes for no value (worker/column_infer.py)."""
    arr = np.asarray(strings)
    if arr.dtype.kind != "S":
        return np.strings.isspace(arr.astype(np.str_))
    flat = np.ascontiguousarray(arr).reshape(-1)
    out = np.zeros(len(flat), dtype=bool)
    if len(flat) == 0 or arr.dtype.itemsize == 0:
        return out.reshape(arr.shape)
    codes = flat.view(np.uint8).reshape(len(flat), arr.dtype.itemsize)
    maybe = np.flatnonzero(_BLANK_BYTE[codes].all(axis=1) & (np.strings.str_len(flat) > 0))
    if len(maybe):  # the few strings of such bytes only, told by their text
        texts = [s.decode("utf-8", "surrogateescape") for s in flat[maybe].tolist()]
        out[maybe] = [t.isspace() for t in texts]
    return out.reshape(arr.shape)
