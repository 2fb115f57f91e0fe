import numpy as np
import pytest

from ps.config import OptimizerConfig, TableConfig
from ps.errors import StorageError
from ps.sharding import slot_of
from ps.storage.store import Store, encode_keys


def test_keys_are_table_slot_then_id_big_endian_and_sort_numerically():
    ids = np.array([2**64 - 1, 0, 256, 1, 2**63], dtype=np.uint64)
    keys = encode_keys(7, ids)
    assert all(len(k) == 14 and k[:4] == b"\x00\x00\x00\x07" for k in keys)  # table number 7
    assert keys[2][6:] == b"\x00" * 6 + b"\x01\x00"  # id 256, big-endian, trailing NUL kept
    decoded = [(int.from_bytes(k[4:6], "big"), int.from_bytes(k[6:], "big")) for k in keys]
    assert decoded == list(zip(slot_of(ids).tolist(), ids.tolist()))
    assert sorted(keys) == [keys[i] for i in sorted(range(5), key=lambda i: decoded[i])]


def test_rows_tables_and_counts_survive_reopen(tmp_path):
    cfg = TableConfig("emb", 3, optimizer=OptimizerConfig("sgd", 1.0))
    s = Store(str(tmp_path))
    s.check_identity(1, 4)
    s.create_table(cfg)
    ids = np.array([5, 0, 2**64 - 1], dtype=np.uint64)
    rows = np.arange(3 * 6, dtype=np.float32).reshape(3, 6)  # width 6: 2 floats + 4 statistics
    complete = np.array([True, True, False])  # the last id is not admitted: statistics only
    counts = {"admitted": 2, "pending": 1}
    s.put_rows("emb", ids, rows, np.array([7, 8, 2**64 - 1], dtype=np.uint64), complete, counts)
    s.set_flushed_seq(42)
    s.close()
    s = Store(str(tmp_path))
    s.check_identity(1, 4)
    assert s.load_tables() == [cfg]
    assert s.counts("emb") == counts and s.flushed_seq() == 42
    found, got, lsn, full = s.get_rows("emb", np.array([0, 7, 5, 2**64 - 1], dtype=np.uint64), 6)
    assert found.tolist() == [True, False, True, True] and full.tolist() == [True, True, False]
    assert np.array_equal(got[:2], rows[[1, 0]]) and lsn.tolist() == [8, 7, 2**64 - 1]
    assert np.array_equal(got[2], [0, 0, 14, 15, 16, 17])  # statistics only, the rest zero
    assert sorted(i for i, _ in s.iter_rows("emb")) == sorted(ids.tolist())
    with pytest.raises(StorageError, match="belongs to shard 1 of 4.*started as shard 0 of 2"):
        s.check_identity(0, 2)
    s.put_rows("emb", ids[:0], rows[:0], lsn[:0], complete[:0], {"admitted": 1, "pending": 1}, delete=ids[:1])
    assert s.get_rows("emb", ids[:1], 6)[0].tolist() == [False] and s.counts("emb")["admitted"] == 1
    s.close()


def test_a_row_of_the_wrong_size_is_reported(tmp_path):
    s = Store(str(tmp_path))
    s.create_table(TableConfig("emb", 2))
    one = np.ones(1, dtype=bool)
    s.put_rows("emb", np.array([1], dtype=np.uint64), np.ones((1, 7), np.float32), np.zeros(1), one, {})
    with pytest.raises(StorageError, match=r"row of 36 bytes, expected 32 \(a trained row\) or 24"):
        s.get_rows("emb", np.array([1], dtype=np.uint64), 6)
    s.close()
