import numpy as np
import pytest

from ps.config import OptimizerConfig, TableConfig
from ps.errors import StorageError
from ps.store import Store, encode_keys
from ps.sharding import slot_of


def test_keys_are_slot_then_id_big_endian_and_sort_numerically():
    ids = np.array([2**64 - 1, 0, 256, 1, 2**63], dtype=np.uint64)
    keys = encode_keys(ids)
    assert all(len(k) == 10 for k in keys)
    assert keys[2][2:] == b"\x00" * 6 + b"\x01\x00"  # id 256, big-endian, trailing NUL kept
    decoded = [(int.from_bytes(k[:2], "big"), int.from_bytes(k[2:], "big")) for k in keys]
    assert decoded == list(zip(slot_of(ids).tolist(), ids.tolist()))
    assert sorted(keys) == [keys[i] for i in sorted(range(5), key=lambda i: decoded[i])]


def test_rows_tables_and_counts_survive_reopen(tmp_path):
    cfg = TableConfig("emb", 3, optimizer=OptimizerConfig("sgd", 1.0))
    s = Store(str(tmp_path))
    s.check_identity(1, 4)
    s.create_table(cfg)
    ids = np.array([5, 0, 2**64 - 1], dtype=np.uint64)
    rows = np.arange(9, dtype=np.float32).reshape(3, 3)
    s.put_rows("emb", ids, rows, np.array([7, 8, 2**64 - 1], dtype=np.uint64), total_rows=3)
    s.set_flushed_seq(42)
    s.close()
    s = Store(str(tmp_path))
    s.check_identity(1, 4)
    assert s.load_tables() == [cfg]
    assert s.count_rows("emb") == 3 and s.flushed_seq() == 42
    found, got, lsn = s.get_rows("emb", np.array([0, 7, 5], dtype=np.uint64), 3)
    assert found.tolist() == [True, False, True]
    assert np.array_equal(got, rows[[1, 0]]) and lsn.tolist() == [8, 7]
    assert sorted(i for i, _ in s.iter_rows("emb")) == sorted(ids.tolist())
    with pytest.raises(StorageError, match="belongs to shard 1 of 4.*started as shard 0 of 2"):
        s.check_identity(0, 2)
    s.close()


def test_a_row_of_the_wrong_size_is_reported(tmp_path):
    s = Store(str(tmp_path))
    s.create_table(TableConfig("emb", 2))
    s.put_rows("emb", np.array([1], dtype=np.uint64), np.ones((1, 3), dtype=np.float32), np.zeros(1), total_rows=1)
    with pytest.raises(StorageError, match="row of 20 bytes, expected 16"):
        s.get_rows("emb", np.array([1], dtype=np.uint64), 2)
    s.close()
