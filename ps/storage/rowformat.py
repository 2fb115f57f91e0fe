"""The "rows" column family's keys and values: their byte grammar, and the numpy dtypes that write and read them.

    key   := table:u32be slot:u16be id:u64be   (14 bytes, KEY_DTYPE; table: the table's number)
    value := row lsn:u64le                     an admitted id (it has a trained row)
           | stats lsn:u64le                   an id not admitted yet: its embedding and state are the initial ones
    row   := f32le[width]                      a table of values_at_rest "float32" (the default)
           | f16le[dim] f32le[width - dim]     a table of values_at_rest "float16": its embedding as float16
row and stats are the floats of ps.rows.layout's row (`width` of them, stats its last STATS_FLOATS), little-endian.
A float16 embedding is the float32 one rounded to nearest, clipped to +-HALF_MAX first, and never past the table's
weight_bound (to_half); it reads back as float32 (as_stored). lsn is the journal sequence number of the last push
applied to the row, so replaying the journal after a crash applies each push to each row exactly once; a restore's
copy sets it to 0. Big-endian keys make byte order numeric order, so a table's rows are one contiguous key range,
and each of its slots a range inside it, to scan or move.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ps.config import HALF_MAX
from ps.rows.layout import KEY_BYTES, STATS_FLOATS, stored_sizes
from ps.sharding import slot_of
from ps.storage.meta import MAX_TABLE_NUMBER

ROWS_CF = "rows"  # the column family of every table's rows (ps.storage.store says why one for all)
KEY_DTYPE = np.dtype([("table", ">u4"), ("slot", ">u2"), ("id", ">u8")])  # packed
if KEY_DTYPE.itemsize != KEY_BYTES:  # ps.rows.layout counts a row's bytes on disk (`ps-server size`) with KEY_BYTES
    raise ImportError(f"RocksDB keys are {KEY_DTYPE.itemsize} bytes, but ps.rows.layout.KEY_BYTES is {KEY_BYTES}")
if np.iinfo(KEY_DTYPE["table"]).max != MAX_TABLE_NUMBER:  # ps.storage.meta reads a "tid/" value up to it
    raise ImportError(f"a row key's table field takes up to {np.iinfo(KEY_DTYPE['table']).max}, but "
                      f"ps.storage.meta.MAX_TABLE_NUMBER is {MAX_TABLE_NUMBER}")  # fmt: skip


def encode_keys(table_id: int, ids: np.ndarray) -> list[bytes]:
    """RocksDB keys (table:u32be slot:u16be id:u64be) of ids of table number table_id. `.view("V14")`, not
    "S14": S strips trailing NUL bytes."""
    keys = np.empty(len(ids), dtype=KEY_DTYPE)
    keys["table"] = table_id
    keys["slot"] = slot_of(ids)
    keys["id"] = ids
    return keys.view(f"V{KEY_DTYPE.itemsize}").tolist()


def decode_ids(keys: list[bytes]) -> np.ndarray:
    """The ids (uint64) of row keys as encode_keys makes them."""
    return np.frombuffer(b"".join(keys), dtype=KEY_DTYPE)["id"].astype(np.uint64)


def value_dtype(width: int, half_floats: int = 0) -> np.dtype:
    """A stored row value of `width` floats, the first half_floats of them float16: row lsn:u64le (the module's
    grammar; "half" the float16 part of row, "row" its float32 part), of stored_sizes(width, half_floats).trained
    bytes."""
    half = [("half", "<f2", (half_floats,))] if half_floats else []
    return np.dtype([*half, ("row", "<f4", (width - half_floats,)), ("lsn", "<u8")])


def unpacked_rows(packed: np.ndarray) -> np.ndarray:
    """The float32 rows (n, width) of values parsed as value_dtype: "row" itself, or "half" widened beside it."""
    if "half" not in packed.dtype.names:
        return packed["row"]
    return np.concatenate((packed["half"].astype(np.float32), packed["row"]), axis=1)


def pack_rows(packed: np.ndarray, rows: np.ndarray, bound: float) -> None:
    """Fills the row of each value of `packed` (value_dtype's, lsn left as is) from float32 rows (n, width); bound:
    the table's weight_bound (to_half)."""
    if "half" not in packed.dtype.names:
        packed["row"] = rows
        return
    half_floats = packed.dtype["half"].shape[0]
    packed["half"] = to_half(rows[:, :half_floats], bound)
    packed["row"] = rows[:, half_floats:]


class AtRest(NamedTuple):
    """How a table's trained rows are at rest: the leading floats stored as float16 (RowLayout.half_floats), and
    the weight_bound those stay within (to_half)."""

    half_floats: int
    weight_bound: float


def to_half(values: np.ndarray, bound: float) -> np.ndarray:
    """float32 values as a float16 embedding at rest: clipped to +-HALF_MAX, rounded to nearest (ties to even);
    where bound > 0 (the table's weight_bound) and rounding took a value within +-bound past it, the float16 next
    to it toward zero instead, which lies between the value and zero: a row the servers clipped stays within its
    bound at rest."""
    half = np.clip(values, -HALF_MAX, HALF_MAX).astype(np.float16)
    if bound > 0:
        bound = np.float32(bound)  # as the servers clip to it (ps.rows.update)
        over = (np.abs(half) > bound) & (np.abs(values) <= bound)
        if over.any():
            half[over] = np.nextafter(half[over], np.float16(0))
    return half


def as_stored(values: np.ndarray, bound: float) -> np.ndarray:
    """float32 values as a float16 embedding at rest reads back (to_half's, widened)."""
    return to_half(values, bound).astype(np.float32)


PENDING_BYTES = value_dtype(STATS_FLOATS).itemsize  # a pending id's value
if (value_dtype(1).itemsize, PENDING_BYTES) != stored_sizes(1):  # the grammar and ps.rows.layout's sizes agree
    raise ImportError(f"a stored row value of 1 float is {value_dtype(1).itemsize} bytes by the grammar and "
                      f"{stored_sizes(1).trained} by ps.rows.layout.stored_sizes")  # fmt: skip
