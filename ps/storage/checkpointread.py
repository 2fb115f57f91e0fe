"""A table's rows and counts read from a checkpoint's RocksDB (a shard folder, opened read-only): the admitted rows of
a table for an export (read_table), and every table's admitted count (admitted_counts), each read by its grammar
(ps.storage.rowformat, ps.storage.meta) and its damage a CheckpointDamagedError naming it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ps.rows.layout import RowLayout
from ps.storage.meta import COUNT_PREFIX, META_CF, key_name, meta_value, table_ids
from ps.storage.options import iter_prefixed
from ps.storage.readonly import OddRows, checkpoint_damaged, reading_checkpoint
from ps.storage.rowformat import ROWS_CF, decode_ids, unpacked_rows, value_dtype


def read_table(
    source: str, table: str, layout: RowLayout, chunk: int = 1 << 16
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yields (ids, rows (n, layout.width) float32) of the admitted rows of a table of the RocksDB at `source`
    (a checkpoint, opened read-only), in key order, chunk rows at a time; pending ids (values of STATS_FLOATS
    floats) are skipped. CheckpointDamagedError where RocksDB finds damage in it, and, once every row is
    read, for stored values of neither size (naming how many, and the first one's id and key): damaged rows,
    or a layout (the manifest's config) that does not match them."""
    damaged = checkpoint_damaged(source)
    with reading_checkpoint(source) as (src, names, _):
        numbers = table_ids(src.get_column_family(META_CF), damaged) if META_CF in names else {}
        if ROWS_CF not in names or table not in numbers:
            return
        prefix = numbers[table].to_bytes(4, "big")
        keys, values, odd = [], [], OddRows(layout)
        for key, value in iter_prefixed(src.get_column_family(ROWS_CF), prefix):
            if len(value) == odd.sizes.trained:
                keys.append(key)
                values.append(value)
            else:
                odd.saw(key, value)
            if len(keys) == chunk:
                yield _decoded(keys, values, layout)
                keys, values = [], []
        odd.check(damaged, table)
        if keys:
            yield _decoded(keys, values, layout)


def admitted_counts(source: str) -> dict[str, int]:
    """{table name: admitted rows} as the RocksDB at `source` (a checkpoint, opened read-only) records them: its
    count/ keys, written in the batch of every write of the rows they count. CheckpointDamagedError where RocksDB
    finds damage in it, or a value that does not read as its grammar says (meta_value)."""
    damaged = checkpoint_damaged(source)
    with reading_checkpoint(source) as (src, names, _):
        if META_CF not in names:
            return {}
        meta = src.get_column_family(META_CF)
        out = dict.fromkeys(table_ids(meta, damaged), 0)  # a table with no row written has no count yet
        for key, raw in iter_prefixed(meta, COUNT_PREFIX):
            out[key_name(key)] = meta_value(key, raw, damaged)["admitted"]
        return out


def _decoded(keys: list[bytes], values: list[bytes], layout: RowLayout) -> tuple[np.ndarray, np.ndarray]:
    """(ids, rows (n, layout.width) float32) of trained rows' keys and values."""
    ids = decode_ids(keys)
    packed = np.frombuffer(b"".join(values), dtype=value_dtype(layout.width, layout.half_floats))
    return ids, np.ascontiguousarray(unpacked_rows(packed))
