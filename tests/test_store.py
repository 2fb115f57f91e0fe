import contextlib
import json
import os
import threading

import numpy as np
import pytest

from ps.config import OptimizerConfig, TableConfig
from ps.errors import DataLossError, StorageError
from ps.rows.layout import STATS_FLOATS, layout_of, stored_sizes
from ps.sharding import slot_of
from ps.storage import options as options_module
from ps.storage import tablecatalog as tablecatalog_module
from ps.storage.options import multi_get
from ps.storage.rowformat import encode_keys
from ps.storage.store import Store


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
    s.meta.check_identity(1, 4)
    s.create_table(cfg)
    ids = np.array([5, 0, 2**64 - 1], dtype=np.uint64)
    rows = np.arange(3 * 6, dtype=np.float32).reshape(3, 6)  # width 6: 2 floats + 4 statistics
    complete = np.array([True, True, False])  # the last id is not admitted: statistics only
    counts = {"admitted": 2, "pending": 1}
    s.put_rows("emb", ids, rows, np.array([7, 8, 2**64 - 1], dtype=np.uint64), complete, counts)
    s.meta.set_flushed_seq(42)
    s.close()
    s = Store(str(tmp_path))
    s.meta.check_identity(1, 4)
    assert s.load_tables() == [cfg]
    assert s.counts("emb") == {**counts, "trained": True} and s.meta.flushed_seq() == 42  # a value without the flag
    found, got, lsn, full = s.get_rows("emb", np.array([0, 7, 5, 2**64 - 1], dtype=np.uint64), 6)
    assert found.tolist() == [True, False, True, True] and full.tolist() == [True, True, False]
    assert np.array_equal(got[:2], rows[[1, 0]]) and lsn.tolist() == [8, 7, 2**64 - 1]
    assert np.array_equal(got[2], [0, 0, 14, 15, 16, 17])  # statistics only, the rest zero
    assert sorted(i for i, _ in s.iter_rows("emb")) == sorted(ids.tolist())
    with pytest.raises(
        StorageError,
        match="belongs to shard 1 of 4.*started as shard 0 of 2: start it with --shard-id 1 --num-shards 4, or",
    ):
        s.meta.check_identity(0, 2)
    s.put_rows("emb", ids[:0], rows[:0], lsn[:0], complete[:0], {"admitted": 1, "pending": 1}, delete=ids[:1])
    assert s.get_rows("emb", ids[:1], 6)[0].tolist() == [False] and s.counts("emb")["admitted"] == 1
    s.close()


def test_a_write_in_any_order_reads_back_row_by_row(tmp_path):
    # put_rows writes in key order: each id must keep its own row, lsn and completeness, whatever order they come in.
    rng = np.random.default_rng(8)
    s = Store(str(tmp_path))
    s.create_table(TableConfig("emb", 2, optimizer=OptimizerConfig("sgd", 1.0)))
    ids = rng.choice(2**40, 5_000, replace=False).astype(np.uint64)
    rows = rng.standard_normal((5_000, 6)).astype(np.float32)
    lsn = rng.integers(0, 2**63, 5_000, dtype=np.uint64)
    complete = rng.random(5_000) < 0.7
    for background in (False, True):
        s.put_rows("emb", ids, rows, lsn, complete, {"admitted": 0, "pending": 0}, background=background)
        s.drain()
        found, got, got_lsn, got_complete = s.get_rows("emb", ids, 6)
        assert found.all() and np.array_equal(got_lsn, lsn) and np.array_equal(got_complete, complete)
        assert np.array_equal(got[complete], rows[complete])
        assert np.array_equal(got[~complete, 2:], rows[~complete, 2:]) and not got[~complete, :2].any()
        rows = rows + 1.0
    s.close()


def test_a_row_of_the_wrong_size_is_reported(tmp_path):
    s = Store(str(tmp_path))
    s.create_table(TableConfig("emb", 2))
    one = np.ones(1, dtype=bool)
    s.put_rows("emb", np.array([1], dtype=np.uint64), np.ones((1, 7), np.float32), np.zeros(1), one, {})
    with pytest.raises(StorageError, match=r"row of 36 bytes, expected 32 \(a trained row\) or 24"):
        s.get_rows("emb", np.array([1], dtype=np.uint64), 6)
    s._rows().put(encode_keys(s.table_number("emb"), np.array([2], dtype=np.uint64))[0], b"")  # an empty value
    with pytest.raises(StorageError, match=r"row of 0 bytes, expected 32"):
        s.get_rows("emb", np.array([3, 2], dtype=np.uint64), 6)
    # 40 + 24 bytes: as many as two trained rows, and still a damaged value
    for i, size in ((4, 40), (5, 24)):
        s._rows().put(encode_keys(s.table_number("emb"), np.array([i], dtype=np.uint64))[0], bytes(size))
    with pytest.raises(StorageError, match=r"row of 40 bytes, expected 32"):
        s.get_rows("emb", np.array([4, 5], dtype=np.uint64), 6)
    s.close()


@pytest.mark.parametrize("dim, optimizer", [(1, "sgd"), (3, "adagrad"), (8, "adam")])
def test_the_values_put_rows_stores_are_of_the_sizes_every_reader_allows(tmp_path, dim, optimizer):
    """stored_sizes, which get_rows, a restore, an export and verify check values against, says the sizes of the
    values put_rows really writes: a trained row's, and a pending id's; RowLayout counts bytes with the same."""
    s = Store(str(tmp_path))
    s.create_table(TableConfig("emb", dim, optimizer=OptimizerConfig(optimizer, 0.1)))
    layout = layout_of(dim, optimizer)
    ids = np.array([3, 9], dtype=np.uint64)
    complete = np.array([True, False])
    rows = np.ones((2, layout.width), np.float32)
    s.put_rows("emb", ids, rows, np.ones(2, np.uint64), complete, {"admitted": 1, "pending": 1})
    written = {int.from_bytes(key[6:], "big"): len(value) for key, value in s._rows().items()}
    s.close()
    sizes = stored_sizes(layout.width)
    assert written == {3: sizes.trained, 9: sizes.pending}
    assert (layout.value_bytes, layout.pending_value_bytes) == sizes == (4 * layout.width + 8, 4 * STATS_FLOATS + 8)


@pytest.mark.parametrize("read_threads", [1, 3])
def test_multi_get_reads_in_order_across_calls_and_threads(tmp_path, monkeypatch, read_threads):
    """A read of more keys than one MultiGet call takes (and than one reader's part) answers each key in order:
    the value where the row is stored, None where it is not."""
    monkeypatch.setattr(options_module, "MAX_KEYS_PER_GET", 7)
    monkeypatch.setattr(options_module, "MIN_KEYS_PER_READER", 10)
    s = Store(str(tmp_path), read_threads=read_threads, index_in_cache=True)
    s.meta.check_identity(0, 1)
    s.create_table(TableConfig("emb", 2, optimizer=OptimizerConfig("sgd", 1.0)))
    stored = np.arange(0, 200, 3, dtype=np.uint64)  # every third id
    rows = np.repeat(stored.astype(np.float32)[:, None], 6, axis=1)
    s.put_rows("emb", stored, rows, stored, np.ones(len(stored), dtype=bool), {"admitted": len(stored), "pending": 0})
    query = np.random.default_rng(0).permutation(np.arange(200, dtype=np.uint64))[:61]
    values = multi_get(s._rows(), encode_keys(s.table_number("emb"), query), s._readers, s.read_threads)
    assert len(values) == len(query)
    for i, v in zip(query.tolist(), values):
        assert (v is None) == (i % 3 != 0)
        if v is not None:
            assert np.frombuffer(v[:24], dtype=np.float32).tolist() == [float(i)] * 6
    found, got, lsn, _ = s.get_rows("emb", query, 6)
    assert found.tolist() == [i % 3 == 0 for i in query.tolist()]
    assert np.array_equal(got[:, 0], query[found].astype(np.float32)) and np.array_equal(lsn, query[found])
    s.close()


def newest_options_text(path) -> str:
    """The OPTIONS file RocksDB wrote last in a data dir (OPTIONS-NNNNNN, zero-padded: the greatest name)."""
    return max((p for p in path.iterdir() if p.name.startswith("OPTIONS-")), key=lambda p: p.name).read_text()


@pytest.mark.parametrize("bounded", [False, True])
def test_a_bounded_store_partitions_its_index(tmp_path, bounded):
    """Under a memory bound (index and filter blocks in the block cache) the index is partitioned under a pinned
    top level and the last level keeps no filters; without one, whole index and filter blocks stay with the
    tables. Filters are whole either way."""
    Store(str(tmp_path), index_in_cache=bounded).close()
    text = newest_options_text(tmp_path)
    section = text[text.index('[TableOptions/BlockBasedTable "meta"]') :]
    assert ("index_type=kTwoLevelIndexSearch" in section) == bounded
    assert "partition_filters=false" in section
    meta_cf = text[text.index('[CFOptions "meta"]') :]
    assert ("optimize_filters_for_hits=true" in meta_cf.split("[", 2)[1]) == bounded


@pytest.mark.parametrize("bounded", [False, True])
def test_every_memtable_keeps_a_bloom_filter_of_its_keys(tmp_path, bounded):
    """Each column family's memtables keep a whole-key Bloom filter (reads skip a memtable that lacks the key),
    and a row still in the memtable is read back: the filter answers no false "absent"."""
    s = Store(str(tmp_path), index_in_cache=bounded)
    s.meta.check_identity(0, 1)
    s.create_table(TableConfig("emb", 2, optimizer=OptimizerConfig("sgd", 1.0)))  # rows of 6 floats
    ids = np.arange(0, 3000, 3, dtype=np.uint64)
    rows = np.repeat(ids.astype(np.float32)[:, None], 6, axis=1)
    s.put_rows("emb", ids, rows, ids, np.ones(len(ids), dtype=bool), {"admitted": len(ids), "pending": 0})
    found, got, _, _ = s.get_rows("emb", np.arange(3000, dtype=np.uint64), 6)
    assert found.tolist() == [i % 3 == 0 for i in range(3000)] and np.array_equal(got, rows)
    s.close()
    cf_sections = newest_options_text(tmp_path).split("[CFOptions ")[1:]
    assert len(cf_sections) >= 2
    for cf_section in cf_sections:
        assert "memtable_whole_key_filtering=true" in cf_section
        assert "memtable_prefix_bloom_size_ratio=0.020000" in cf_section


def test_rocksdbs_own_text_logs_are_kept_to_a_few(tmp_path):
    """Each open rotates RocksDB's LOG; a data dir keeps KEEP_INFO_LOGS of them, not one per start ever."""
    for _ in range(options_module.KEEP_INFO_LOGS + 4):
        Store(str(tmp_path)).close()
    logs = [f for f in os.listdir(tmp_path) if f.startswith("LOG")]
    assert len(logs) == options_module.KEEP_INFO_LOGS, logs


def test_rocksdbs_text_log_rolls_over_by_size_while_the_store_stays_open(tmp_path, monkeypatch):
    """A server that runs for weeks writes RocksDB's LOG on every flush and compaction (about 2 MB an hour of
    training): it rolls over at INFO_LOG_BYTES, so a data dir's text logs stay under KEEP_INFO_LOGS files of that
    size instead of one file that grows as long as the process lives."""
    limit = 64 << 10
    monkeypatch.setattr(options_module, "INFO_LOG_BYTES", limit)
    s = Store(str(tmp_path))
    s.meta.check_identity(0, 1)
    s.create_table(TableConfig("emb", 2, optimizer=OptimizerConfig("sgd", 1.0)))
    ids = np.arange(100, dtype=np.uint64)
    try:
        for _ in range(40):  # each flush (and the compactions it brings) logs about 10 KB: some 400 KB in all
            s.put_rows("emb", ids, np.ones((100, 6), np.float32), ids, np.ones(100, dtype=bool),
                       {"admitted": 100, "pending": 0})  # fmt: skip
            s.flush()
    finally:
        s.close()
    sizes = {f: os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path) if f.startswith("LOG")}
    assert 1 < len(sizes) <= options_module.KEEP_INFO_LOGS, sizes
    assert max(sizes.values()) < limit + (16 << 10), sizes  # rolled at the limit (plus the line that crossed it)


def test_a_data_dir_keeps_the_first_cluster_name_it_runs_with(tmp_path):
    s = Store(str(tmp_path))
    assert not s.meta.check_cluster("")  # unnamed: nothing to record, so a name may come later
    assert s.meta.check_cluster("prod") and s.meta.check_cluster("staging")  # any name, unrecorded till record_cluster
    s.meta.record_cluster("prod")
    assert not s.meta.check_cluster("prod")
    for other, said in (("staging", "--cluster 'staging'"), ("", "no --cluster")):
        with pytest.raises(StorageError, match=f"belongs to cluster 'prod', but this server was started with {said}"):
            s.meta.check_cluster(other)
    s.close()
    s = Store(str(tmp_path))
    with pytest.raises(StorageError, match="start it with --cluster prod"):
        s.meta.check_cluster("staging")
    assert not s.meta.check_cluster("prod")
    s.close()


def test_copies_of_the_shard_record_that_disagree_are_said_to_before_the_flags_are_compared(tmp_path):
    """shard.json edited to another shard: whichever shard the server is started as, the refusal says that the
    two copies disagree (one is damaged), not that the dir belongs to the shard its damaged copy names."""
    s = Store(str(tmp_path), shard=(0, 1))
    s.meta.check_identity(0, 1)
    s.close()
    identity = tmp_path / "shard.json"
    record = json.loads(identity.read_text())
    identity.write_text(json.dumps({**record, "shard_id": 1, "num_shards": 2}))
    for shard in ((0, 1), (1, 2), (0, 2)):
        with pytest.raises(DataLossError, match=r"shard.json says shard 1 of 2 \(num_slots \d+\) and RocksDB says shard 0 of 1 .*; one copy "
                           "is damaged"):  # fmt: skip
            Store(str(tmp_path), shard=shard).meta.check_identity(*shard)


def test_copies_of_the_shard_record_that_differ_only_in_a_field_it_does_not_print_name_it(tmp_path):
    """shard.json with an extra key reads as the same shard as RocksDB's copy: the refusal names the field that
    differs, so that the operator sees what is wrong."""
    s = Store(str(tmp_path), shard=(0, 1))
    s.meta.check_identity(0, 1)
    s.close()
    identity = tmp_path / "shard.json"
    identity.write_text(json.dumps({**json.loads(identity.read_text()), "x": 1}))
    with pytest.raises(DataLossError, match=r"\(x: 1 in shard.json, absent in RocksDB\); one copy is damaged"):
        Store(str(tmp_path), shard=(0, 1)).meta.check_identity(0, 1)


class Killed(BaseException):
    """Stands for kill -9 between two writes."""


def test_a_restores_record_and_its_new_state_id_are_written_together_or_not_at_all(tmp_path):
    """set_restored: the process killed after its first RocksDB write finds, reopened, either the old state id
    and no "restored" record or the new id with the record; never a new id without its record."""
    s = Store(str(tmp_path))
    before = s.meta.state_id()
    writes = []

    class KilledAfterOneWrite:
        def __init__(self, wrapped):
            self.wrapped = wrapped

        def __getattr__(self, name):
            attr = getattr(self.wrapped, name)
            if name not in ("put", "delete", "write"):
                return attr

            def write(*args, **kwargs):
                if writes:
                    raise Killed
                writes.append(name)
                return attr(*args, **kwargs)

            return write

    db, meta = s._dir.db, s._dir.meta_cf
    s._dir.db, s._dir.meta_cf = KilledAfterOneWrite(db), KilledAfterOneWrite(meta)
    try:
        s.meta.set_restored("/checkpoints/c1", "ab" * 32)
    except Killed:
        pass
    s._dir.db, s._dir.meta_cf = db, meta
    del db, meta  # a column family held open keeps RocksDB's LOCK past close
    assert writes  # set_restored wrote something
    s.close()
    s = Store(str(tmp_path))
    restored, now = s.meta.restored(), s.meta.state_id()
    s.close()
    assert (restored, now == before) in ((None, True), ({"checkpoint": "/checkpoints/c1", "sha256": "ab" * 32}, False))
    assert restored is not None  # a single write: it went through whole


def test_a_table_whose_config_is_gone_is_data_loss(tmp_path):
    s = Store(str(tmp_path))
    try:
        s.create_table(TableConfig("emb", 2))
        s._dir.meta_cf.delete(b"table/emb")  # as damage would lose it under a running server
        with pytest.raises(DataLossError) as failed:
            s.disk_bytes("emb")
        assert str(failed.value) == (
            f"RocksDB in data dir {tmp_path} is damaged: table 'emb' has no config (meta key table/emb). `ps-server "
            f"verify {tmp_path}` lists what is damaged; restore the dir from a backup or checkpoint"
        )
    finally:
        s.close()


def test_a_read_of_the_table_numbers_that_races_a_create_keeps_the_new_tables_number(tmp_path, monkeypatch):
    """A store's first read of the table numbers (a pull's, say) runs while create_table writes table b: the numbers
    it keeps hold b's, so b's rows are found and the next table gets a number of its own, not b's."""
    path = str(tmp_path / "db")
    with contextlib.closing(Store(path)) as s:
        s.create_table(TableConfig("a", 4))
    read, paused, go = tablecatalog_module.read_table_numbers, threading.Event(), threading.Event()

    def first_read_pauses(meta):  # the first read of the numbers waits, once it has read them, until `go`
        numbers = read(meta)
        if not paused.is_set():
            paused.set()
            go.wait(30)
        return numbers

    monkeypatch.setattr(tablecatalog_module, "read_table_numbers", first_read_pauses)
    with contextlib.closing(Store(path)) as s:
        reader = threading.Thread(target=s.table_number, args=("a",))
        reader.start()
        assert paused.wait(30)
        creator = threading.Thread(target=s.create_table, args=(TableConfig("b", 4),))
        creator.start()
        creator.join(1.0)  # done by now, unless it waits for the read to end
        go.set()
        reader.join(30)
        creator.join(30)
        assert s._dir.meta_cf.get(b"tid/b") == b"1"
        assert s.table_number("b") == 1
        s.create_table(TableConfig("c", 4))
        assert s.table_number("c") == 2
