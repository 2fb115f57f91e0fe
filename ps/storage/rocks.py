"""The RocksDB binding (rocksdict): the one module that imports it. The storage modules take from here the binding's
types they use: the database and its column families (Rdict, ColumnFamily), a batch of writes (WriteBatch), a
checkpoint (Checkpoint), the options a database is opened, read and written with (Options, AccessType,
ReadOptions, WriteOptions) and those of its SST files (BlockBasedOptions, BlockBasedIndexType, Cache,
DBCompressionType, DBRecoveryMode). The binding raises RocksDB's errors as plain Exceptions, their text RocksDB's
("IO error: ...", "Corruption: ..."): ps.storage.datadir and ps.storage.readonly read them as ours.
"""

from __future__ import annotations

from rocksdict import (
    AccessType,
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    Checkpoint,
    DBCompressionType,
    DBRecoveryMode,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

ColumnFamily = Rdict  # a RocksDB, or one of its column families, as rocksdict opens them

__all__ = [
    "AccessType",
    "BlockBasedIndexType",
    "BlockBasedOptions",
    "Cache",
    "Checkpoint",
    "ColumnFamily",
    "DBCompressionType",
    "DBRecoveryMode",
    "Options",
    "Rdict",
    "ReadOptions",
    "WriteBatch",
    "WriteOptions",
]
