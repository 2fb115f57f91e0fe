"""Table against a trivial in-memory model under random pull / push / flush / restart / crash sequences,
with a RAM tier so small that eviction happens all the time."""

import os
import pathlib
import shutil
import tempfile
from unittest import mock

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.errors import InvalidArgumentError
from ps.rows.initializers import init_rows
from ps.rows.layout import layout_of
from ps.server_config import ServerConfig
from ps.storage import budget as budget_module
from ps.storage import journal as journal_module
from ps.storage import journalformat
from ps.storage.verify import verify_data_dir
from tests.conftest import crash

CFG = TableConfig("t", 3, InitializerConfig("uniform", 0.5, seed=9), OptimizerConfig("sgd", 1.0))
ID_POOL = [0, 1, 2, 255, 256, 2**32, 2**63, 2**64 - 2, 2**64 - 1] + list(range(1000, 1030))
ids_strategy = st.lists(st.sampled_from(ID_POOL), min_size=0, max_size=15)


def initial(ids):
    out = np.empty((len(ids), 3), dtype=np.float32)
    init_rows(CFG.initializer, np.array(ids, dtype=np.uint64), out, 3)
    return out


TINY_RAM_TIER = 8 * layout_of(3, "sgd").ram_bytes  # 8 rows: requests of up to 15 ids are chunked, much is evicted


@pytest.fixture(autouse=True)
def tiny_shares(monkeypatch):
    """A RAM tier of 8 rows holds a table: a share may be one row here (MIN_SHARE_ROWS rows otherwise)."""
    monkeypatch.setattr(budget_module, "MIN_SHARE_ROWS", 1)


class TableModel(RuleBasedStateMachine):
    """The model: a dict id -> row; a missing id reads as its initial value. SGD lr=1: row -= grad.
    The shard runs with a RAM tier of 8 rows and a flusher that never fires on its own."""

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="table-sm-")
        self.model: dict[int, np.ndarray] = {}

    @initialize()
    def open(self):
        self.shard = Shard(ServerConfig(data_dir=self.dir, cache_bytes=TINY_RAM_TIER, flush_interval_s=3600))
        self.table = self.shard.create_table(CFG)

    def expected(self, ids):
        init = initial(ids)
        return np.array([self.model.get(i, init[k]) for k, i in enumerate(ids)], dtype=np.float32).reshape(-1, 3)

    @rule(ids=ids_strategy)
    def pull(self, ids):
        got = self.shard.pull("t", np.array(ids, dtype=np.uint64))
        np.testing.assert_array_equal(got, self.expected(ids))

    @rule(ids=st.lists(st.sampled_from(ID_POOL), unique=True, max_size=12), seed=st.integers(0, 1000))
    def push(self, ids, seed):
        grads = np.random.default_rng(seed).integers(-4, 5, (len(ids), 3)).astype(np.float32)
        before = self.expected(ids)
        self.shard.push("t", np.array(ids, dtype=np.uint64), grads)
        for k, i in enumerate(ids):
            self.model[i] = before[k] - grads[k]

    @precondition(lambda self: len(self.model) > 0)
    @rule(ids=st.lists(st.sampled_from(ID_POOL), min_size=1, max_size=6), data=st.data())
    def push_with_duplicates_changes_nothing(self, ids, data):
        ids = ids + [data.draw(st.sampled_from(ids))]
        with pytest.raises(InvalidArgumentError, match="repeats id"):
            self.shard.push("t", np.array(ids, dtype=np.uint64), np.ones((len(ids), 3), dtype=np.float32))

    @rule(ids=st.lists(st.sampled_from(ID_POOL), unique=True, min_size=1, max_size=12))
    def push_whose_journal_write_fails_changes_nothing(self, ids):
        journal = self.shard.journal

        def disk_full(fd, parts, offset):  # the first 10 bytes of the record reach the file, then the disk is full
            return os.pwrite(fd, bytes(parts[0])[:10], offset)

        # the write path a full disk can fail: pwritev (space the journal has prepared is written by memory copy)
        no_prepared_space = mock.patch.object(
            type(journal._prefault), "mapped_end", new_callable=mock.PropertyMock, return_value=0
        )
        with (
            no_prepared_space,
            mock.patch.object(journal_module.os, "pwritev", disk_full),
            pytest.raises(OSError, match="journal write of .* bytes wrote 10"),
        ):
            self.shard.push("t", np.array(ids, dtype=np.uint64), np.ones((len(ids), 3), dtype=np.float32))
        assert os.path.getsize(journal._path) == journal._segment_size  # the partial record was cut off

    @rule()
    def flush(self):
        self.shard.flush()

    @rule()
    def clean_restart(self):
        self.shard.close()
        self.open()

    @rule()
    def crash(self):
        crash(self.shard)
        self.open()

    @invariant()
    def row_count_and_memory_are_exact(self):
        if hasattr(self, "table"):
            assert self.table.num_rows == len(self.model)
            assert self.table.arena.used <= 8 and len(self.table.arena.index) == self.table.arena.used

    def teardown(self):
        self.shard.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestTableModel = TableModel.TestCase
# 15 runs of up to 30 steps: each of the seven rules runs a few dozen times a test run.
TestTableModel.settings = settings(max_examples=15, stateful_step_count=30, deadline=None)


def test_adagrad_state_survives_flush_and_restart(tmp_path):
    cfg = TableConfig("a", 2, optimizer=OptimizerConfig("adagrad", 0.1, {"initial_accumulator": 1.0}))
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    shard.create_table(cfg)
    ids = np.array([7, 8], dtype=np.uint64)
    shard.push("a", ids, np.full((2, 2), 2.0, dtype=np.float32))
    before = shard.table("a").peek(ids)
    np.testing.assert_allclose(before[:, 2:4], 5.0)  # 1 + 2^2
    np.testing.assert_array_equal(before[:, 4:], [[1, 0, 0, 1]] * 2)  # show, click, last step, admitted
    shard.close()
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    np.testing.assert_array_equal(shard.table("a").peek(ids), before)
    assert (
        shard.table("a").writer.stored_counts == {"admitted": 2, "pending": 0, "trained": True}
        and shard.journal.size_bytes() == 0
    )
    shard.close()


def test_a_pull_of_int64_ids_finds_the_rows_pushed_under_their_uint64_values(tmp_path):
    """The compiled index compares uint64 keys: a pull of int64 ids (an in-process caller's) is taken as uint64,
    as a push is, not missed and given an initial row that would hide the pushed one."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d"), flush_interval_s=3600))
    try:
        shard.create_table(TableConfig("t", 2, InitializerConfig("zeros", 0.0, seed=1), OptimizerConfig("sgd", 1.0)))
        ids = np.array([5, 2**40 + 3], dtype=np.uint64)
        shard.push("t", ids, np.full((2, 2), -1.0, np.float32))
        for pulled in (ids.astype(np.int64), ids):
            np.testing.assert_array_equal(shard.pull("t", pulled), np.ones((2, 2), np.float32))
    finally:
        shard.close()


@pytest.mark.parametrize("loss", ["journal and mark deleted", "tail past the mark lost"])
def test_rows_written_back_before_a_flush_say_which_journal_records_were_written(tmp_path, loss):
    """A row evicted to RocksDB carries the seq of the last push applied to it, so that push's record (and every
    one before it) was written: journal records missing up to it are refused like those up to the mark (the mark
    lags the appends by a second, and may be gone), and once the loss is accepted, new pushes get seqs past it, so
    that a replay after a crash does not skip them on that row as already applied."""
    config = dict(data_dir=str(tmp_path), cache_bytes=TINY_RAM_TIER, flush_interval_s=3600)
    spec = TableConfig("t", 3, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0))
    hot = np.array([7], dtype=np.uint64)
    shard = Shard(ServerConfig(**config))
    shard.create_table(spec)
    shard.flush()
    for _ in range(5):
        shard.push("t", hot, np.ones((1, 3), np.float32))
    for k in range(20):  # evict hot (written back with the seq of its last push) and the rows after it
        shard.push("t", np.arange(1000 + 10 * k, 1010 + 10 * k, dtype=np.uint64), np.ones((10, 3), np.float32))
    shard.store.drain()  # every row handed to the write-behind is in RocksDB: the crash loses none of them
    written = shard.store.meta.written_seq()
    assert written >= 5 and shard.store.meta.flushed_seq() == 0
    crash(shard)
    if loss == "journal and mark deleted":
        shutil.rmtree(tmp_path / "journal")
        os.remove(tmp_path / "journal-mark.json")
        kept = 0
    else:  # a power loss: the records past the mark replaced by zeros, as the space prepared ahead reads
        (segment,) = journal_module.Journal(str(tmp_path / "journal")).segments()
        kept = 2
        (tmp_path / "journal-mark.json").write_text(f'{{"written_seq": {kept}}}')
        seqs = [r.seq for r in journal_module.Journal(str(tmp_path / "journal")).replay(0)]
        assert seqs[-1] >= written  # the journal holds them all: only the zeros below lose them
        size = os.path.getsize(segment[1])
        keep = _end_of_record(segment[1], kept)
        with open(segment[1], "r+b") as f:
            f.seek(keep)
            f.write(bytes(size - keep))
    with pytest.raises(Exception, match=rf"journal records {kept + 1}\.\.{written} .*are missing .*: no flush has "
                                        rf"written a push to RocksDB yet, and RocksDB holds a row that record "
                                        rf"{written} pushed"):  # fmt: skip
        Shard(ServerConfig(**config))
    lines, damaged = verify_data_dir(str(tmp_path))  # ps-server verify says the same
    assert damaged and [line for line in lines if line.startswith("DAMAGED journal: ") and
                        f"RocksDB holds a row that record {written} pushed" in line], lines  # fmt: skip
    shard = Shard(ServerConfig(**config, accept_journal_loss=True))
    assert shard.journal.next_seq > written
    before = shard.pull("t", hot)
    shard.push("t", hot, np.ones((1, 3), np.float32))  # acknowledged, then the process is killed
    crash(shard)
    shard = Shard(ServerConfig(**config))
    try:
        np.testing.assert_array_equal(shard.pull("t", hot), before - 1)
    finally:
        shard.close()


def _end_of_record(path: str, seq: int) -> int:
    """The byte offset where journal record `seq` of the segment at path ends, by its headers."""
    data, pos = pathlib.Path(path).read_bytes(), 0
    while True:
        _magic, got, payload_len, _check = journalformat.HEADER.unpack_from(data, pos)
        pos += journalformat.HEADER.size + payload_len
        if got == seq:
            return pos


def test_a_journal_record_of_another_dim_than_its_tables_refuses_the_start_naming_it(tmp_path):
    """The update kernel checks no bounds: a record whose grads are not of its table's dim (the journal does not
    match RocksDB's tables) is damage, found before any of it is applied."""
    from ps.errors import DataLossError

    config = ServerConfig(data_dir=str(tmp_path), flush_interval_s=3600)
    shard = Shard(config)
    shard.create_table(TableConfig("t", 4))
    ids = np.arange(3, dtype=np.uint64)
    shard.push("t", ids, np.ones((3, 4), np.float32))
    f32 = np.float32
    seq = shard.journal.append("t", ids, np.ones((3, 2), f32), np.ones(3, f32), np.zeros(3, f32), shard.clock)
    crash(shard)
    with pytest.raises(DataLossError, match=rf"journal record {seq} \(table 't'\) holds grads of dim 2, where the "
                                            r"table's dim is 4"):  # fmt: skip
        Shard(config)
    lines, damaged = verify_data_dir(str(tmp_path))  # ps-server verify says the same
    assert damaged and f"DAMAGED journal: record {seq} holds grads of dim 2 for table 't', whose dim is 4: the " \
                       "journal does not match RocksDB's tables" in lines, lines  # fmt: skip
