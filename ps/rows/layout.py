"""Row layout of a table, in RAM and on disk, and the byte counts that follow from it (used by `ps-server size`).

A row is `width` float32: the embedding, the optimizer state, then STATS_FLOATS per-id statistics:
    row   := embedding:f32[dim]  state:f32[state_floats(optimizer, dim)]  stats
    stats := show:f32  click:f32  last_step:f32  admitted:f32 (0 or 1)
last_step is exact up to 2**24 clock steps. On disk, RocksDB holds an admitted id's row, or a not yet admitted
id's stats, each with its lsn (the journal sequence number of the last push applied to it), under a KEY_BYTES key;
a table of values_at_rest "float16" (ps.config.TableConfig) holds its embedding there as float16, its `half_floats`
(ps.storage.rowformat has the grammar of keys and values).

In RAM a row is one arena line: the row's float32 (padded to an even count), then META_FLOATS of bookkeeping
    meta := lsn:u64  pin:i64  uses:u8  dirty:u8  stored:u8  pad:u8[5]
kept in the line itself so that looking a row up, updating it and marking it touch one place in memory (in
separate arrays they would cost four more cache misses per id); plus RAM_OVERHEAD_BYTES outside the line (its id,
its share of the IdIndex, and its place in the eviction policy's probation queue and ghost fingerprints).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ps.config import FULL_AT_REST, HALF_AT_REST

KEY_BYTES = 14  # table:u32be slot:u16be id:u64be: ps.storage.rowformat.KEY_DTYPE, which refuses to import otherwise
LSN_BYTES = 8
STATS_FLOATS = 4
SHOW, CLICK, LAST_STEP, ADMITTED = range(STATS_FLOATS)  # offsets inside the stats block
META_FLOATS = 6  # lsn, pin, flags: 24 bytes at the end of each arena line
# per arena row outside its line: id u64 and the IdIndex's 2-4 slots of 16 B (keys u64 + vals i64 at load
# 1/2..1/4; the worst case is charged).
INDEX_BYTES_PER_ROW = 64
# ps.storage.eviction: a probation queue entry (id u64, in an array with a quarter to spare: ps.storage.idqueue) and
# a ghost fingerprint (u16)
EVICTION_BYTES_PER_ROW = 12
RAM_OVERHEAD_BYTES = 8 + INDEX_BYTES_PER_ROW + EVICTION_BYTES_PER_ROW


def meta_col(width: int) -> int:
    """First float column of the bookkeeping in an arena line of a `width`-float row (8-byte aligned)."""
    return width + width % 2


def line_floats(width: int) -> int:
    """float32 per arena line of a `width`-float row."""
    return meta_col(width) + META_FLOATS


# RocksDB's own cost per key (index and filter blocks, block headers), rounded up from the bytes per row on disk
# that benchmarks/scale.py reports, less the key and the value (random float rows barely compress).
ROCKSDB_OVERHEAD_BYTES = 8


def half_floats_of(dim: int, values_at_rest: str) -> int:
    """RowLayout.half_floats of a table of `dim` whose embeddings RocksDB holds as values_at_rest: dim for
    HALF_AT_REST, 0 for FULL_AT_REST; ValueError for any other value (an unspecified "" included: a table made of
    it is FULL_AT_REST, ps.config.TableConfig.as_new)."""
    if values_at_rest == HALF_AT_REST:
        return dim
    if values_at_rest == FULL_AT_REST:
        return 0
    raise ValueError(f"values_at_rest {values_at_rest!r} is unknown; expected {FULL_AT_REST!r} or {HALF_AT_REST!r}")


class StoredSizes(NamedTuple):
    """The sizes, in bytes, that a RocksDB value of a table's rows may have (`size in sizes`: one of them)."""

    trained: int  # an admitted id's: its row, then its lsn
    pending: int  # an id's not admitted yet: its statistics, then its lsn


def stored_sizes(width: int, half_floats: int = 0) -> StoredSizes:
    """The sizes a stored value of a table of `width`-float rows may have, the first half_floats of a trained row
    stored as float16 (RowLayout.half_floats): every reader and checker of stored rows (a pull's, a restore's, an
    export's, `ps-server verify`'s) asks this."""
    return StoredSizes(4 * width - 2 * half_floats + LSN_BYTES, 4 * STATS_FLOATS + LSN_BYTES)


@dataclass(frozen=True)
class RowLayout:
    dim: int
    state_floats: int
    half_floats: int = 0  # leading floats of a row that RocksDB holds as float16: dim, or 0 (layout_of)

    @property
    def stats_col(self) -> int:
        """Column of the first statistic."""
        return self.dim + self.state_floats

    @property
    def width(self) -> int:
        """float32 values per row: embedding + optimizer state + statistics."""
        return self.dim + self.state_floats + STATS_FLOATS

    @property
    def sizes_at_rest(self) -> StoredSizes:
        """The sizes of the table's RocksDB values."""
        return stored_sizes(self.width, self.half_floats)

    def written_with(self, size: int) -> str:
        """ " (rows written with values_at_rest X?)" where a stored value of `size` bytes, of neither of
        sizes_at_rest, is a trained row of this layout under the other values_at_rest; else "". For the messages
        naming such rows."""
        other = FULL_AT_REST if self.half_floats else HALF_AT_REST
        if size != stored_sizes(self.width, half_floats_of(self.dim, other)).trained:
            return ""
        return f" (rows written with values_at_rest {other!r}?)"

    @property
    def value_bytes(self) -> int:
        """RocksDB value of an admitted id."""
        return self.sizes_at_rest.trained

    @property
    def pending_value_bytes(self) -> int:
        """RocksDB value of an id not admitted yet (statistics only)."""
        return self.sizes_at_rest.pending

    @property
    def ram_bytes(self) -> int:
        """Bytes one row takes in the RAM tier."""
        return 4 * line_floats(self.width) + RAM_OVERHEAD_BYTES

    @property
    def disk_bytes(self) -> int:
        """Bytes one row takes in RocksDB (key + value + RocksDB overhead; no compression assumed)."""
        return KEY_BYTES + self.value_bytes + ROCKSDB_OVERHEAD_BYTES


def layout_of(dim: int, optimizer: str, values_at_rest: str = FULL_AT_REST) -> RowLayout:
    """The layout of a table of `dim` with `optimizer` (one of ps.rows.optim.OPTIMIZERS) whose embeddings RocksDB
    holds as values_at_rest (half_floats_of); ValueError for an unknown optimizer or values_at_rest."""
    from ps.rows.optim import OPTIMIZERS

    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer {optimizer!r} is unknown; expected one of {sorted(OPTIMIZERS)}")
    return RowLayout(dim, OPTIMIZERS[optimizer].state_floats_for(dim), half_floats_of(dim, values_at_rest))
