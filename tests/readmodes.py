"""How a Store reads its files (ps.storage.options.rocksdb_options: --direct-reads, --mmap-reads): the option lines
RocksDB writes, and rows written without a read mode read back the same with it."""

from __future__ import annotations

import glob
import os

import numpy as np

from ps.config import TableConfig
from ps.storage.store import Store


def options_say(path: str, option: str) -> str:
    """The `option=` line of the newest OPTIONS file RocksDB wrote in path."""
    newest = max(glob.glob(os.path.join(path, "OPTIONS-*")), key=lambda p: int(p.rsplit("-", 1)[1]))
    with open(newest) as f:
        return next(line.strip() for line in f if line.strip().startswith(f"{option}="))


def check_rows_read_back_the_same(path: str, option: str, **read_mode) -> None:
    """Writes rows into SST files with a Store opened plainly (`option` false), reopens it with read_mode (Store
    keyword arguments that set `option` true) and checks that every row, its position and the absent ids read
    back the same."""
    ids = np.arange(0, 5000, 7, dtype=np.uint64)
    rows = np.random.default_rng(0).standard_normal((len(ids), 6)).astype(np.float32)
    s = Store(path)
    s.create_table(TableConfig("emb", 2))
    s.put_rows("emb", ids, rows, np.arange(len(ids), dtype=np.uint64), np.ones(len(ids), bool), {})
    s.flush()  # into SST files, which the reopened store reads in its read mode
    s.close()
    assert options_say(path, option) == f"{option}=false"
    s = Store(path, **read_mode)
    try:
        assert options_say(path, option) == f"{option}=true"
        found, got, lsn, complete = s.get_rows("emb", np.concatenate([ids[::-1], [1, 2]]).astype(np.uint64), 6)
        assert found.tolist() == [True] * len(ids) + [False, False] and complete.all()
        assert np.array_equal(got, rows[::-1]) and lsn.tolist() == list(range(len(ids)))[::-1]
    finally:
        s.close()
