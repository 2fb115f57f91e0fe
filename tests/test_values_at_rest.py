"""A table of values_at_rest "float16": RocksDB holds its embeddings as float16 (ps.storage.rowformat's grammar), so a
row read back from RocksDB has its embedding rounded to float16, clipped to +-65504, and its optimizer state and
statistics exact; checkpoints, restores onto another shard count and exports keep the stored values, and verify reads their sizes as the layout's; a table keeps
the setting it was created with. Oracle: numpy's astype(float16) of the float32 values."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from ps.codec import table_config_from_proto, table_config_to_proto
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.export import export
from ps.engine.shard import Shard
from ps.engine.table import layout_for
from ps.errors import CheckpointDamagedError, DataLossError, InvalidArgumentError, ShardClosingError, TableExistsError
from ps.rows.layout import layout_of
from ps.server_config import ServerConfig
from ps.sharding import SlotMap, slot_of
from ps.storage.readonly import OddRows
from ps.storage.rowformat import encode_keys
from ps.storage.store import Store
from ps.storage.verify import verify_checkpoint, verify_data_dir
from ps.table_toml import table_configs_from_toml
from tests.conftest import exported, one_shard_checkpoint
from worker.schema_file import schema_from_text

HALF = "float16"


def rounded(values: np.ndarray) -> np.ndarray:
    """The oracle: float32 values as a float16 embedding at rest reads back."""
    return np.clip(values, -65504, 65504).astype(np.float16).astype(np.float32)


def test_the_store_keeps_a_float16_tables_embeddings_rounded_and_the_rest_exact(tmp_path):
    cfg = TableConfig("emb", 3, optimizer=OptimizerConfig("adagrad"), values_at_rest=HALF)  # width 3 + 3 + 4
    width = layout_of(3, "adagrad", HALF).width
    ids = np.array([0, 5, 256, 2**64 - 1], dtype=np.uint64)
    rows = np.random.default_rng(0).standard_normal((4, width)).astype(np.float32) * 1000
    rows[0, :3] = [1e6, -1e6, 2e-8]  # beyond float16's range, and below its smallest subnormal
    complete = np.array([True, True, True, False])
    lsn = np.arange(1, 5, dtype=np.uint64)
    store = Store(str(tmp_path))
    try:
        store.create_table(cfg)
        store.put_rows("emb", ids[:2], rows[:2], lsn[:2], complete[:2], {"admitted": 1, "pending": 0})
        store.put_rows("emb", ids[2:], rows[2:], lsn[2:], complete[2:], {"admitted": 3, "pending": 1},
                       background=True)  # fmt: skip
        before_drain = store.get_rows("emb", ids, width)  # the write-behind's rows read as RocksDB will hold them
        store.drain()
        found, got, got_lsn, got_complete = store.get_rows("emb", ids, width)
        sizes = sorted({len(value) for _, value in store.iter_rows("emb")})
    finally:
        store.close()
    assert found.all() and (got_complete == complete).all() and (got_lsn == lsn).all()
    np.testing.assert_array_equal(got[:3, :3], rounded(rows[:3, :3]))
    assert got[0, :3].tolist() == [65504.0, -65504.0, 0.0]
    np.testing.assert_array_equal(got[:3, 3:], rows[:3, 3:])  # the optimizer state and statistics: exact
    np.testing.assert_array_equal(got[3], np.r_[np.zeros(width - 4, np.float32), rows[3, -4:]])  # statistics only
    for a, b in zip(before_drain, (found, got, got_lsn, got_complete)):
        np.testing.assert_array_equal(a, b)
    assert sizes == [4 * 4 + 8, 2 * 3 + 4 * 7 + 8]  # a pending id's; a trained row's, 6 bytes less than float32's
    assert layout_of(3, "adagrad", HALF).value_bytes == 2 * 3 + 4 * 7 + 8


def test_a_float16_row_within_its_weight_bound_stays_within_it_at_rest(tmp_path):
    """float16(0.3) is 0.30004883: an embedding the servers clipped to a weight_bound of 0.3 is stored as the float16
    next below it, written by a flush or by the write-behind alike; values that round within the bound are rounded
    to nearest. Oracle: numpy's float16 rounding, and np.nextafter toward zero where it passes the bound."""
    bound = np.float32(0.3)
    cfg = TableConfig("emb", 4, weight_bound=float(bound), values_at_rest=HALF)
    width = layout_of(4, "adagrad", HALF).width
    rows = np.zeros((2, width), np.float32)
    rows[:, :4] = [[bound, -bound, 0.1, 0.2999], [np.float32(0.29999998), -0.25, 0.0, 1e-9]]
    ids, lsn, complete = np.array([1, 2], np.uint64), np.array([1, 2], np.uint64), np.array([True, True])
    assert float(np.float16(bound)) > bound  # the rounding passes the bound
    want = rounded(rows[:, :4])
    past = np.abs(want) > bound
    want[past] = np.nextafter(want[past].astype(np.float16), np.float16(0)).astype(np.float32)
    assert past.sum() == 3 and (np.abs(want) <= bound).all()
    store = Store(str(tmp_path))
    try:
        store.create_table(cfg)
        store.put_rows("emb", ids[:1], rows[:1], lsn[:1], complete[:1], {"admitted": 1, "pending": 0})
        store.put_rows("emb", ids[1:], rows[1:], lsn[1:], complete[1:], {"admitted": 2, "pending": 0},
                       background=True)  # fmt: skip
        before_drain = store.get_rows("emb", ids, width)[1]
        store.drain()
        got = store.get_rows("emb", ids, width)[1]
    finally:
        store.close()
    np.testing.assert_array_equal(got[:, :4], want)
    np.testing.assert_array_equal(before_drain, got)


def table_config(values_at_rest: str) -> TableConfig:
    return TableConfig("emb", 4, InitializerConfig("zeros"), OptimizerConfig("adagrad", 1.0),
                       values_at_rest=values_at_rest)  # fmt: skip


def test_rows_evicted_reloaded_checkpointed_restored_and_exported_are_float16_rounded(tmp_path):
    """A float16 table with a RAM tier of 300 rows and a float32 twin holding every row get the same push; once
    the float16 shard reopens (its RAM tier empty), every row it serves is the twin's with the embedding rounded,
    and its state exact; so are a restore of its checkpoint onto two shards and the checkpoint's export."""
    n = 3000
    ids = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(7919)
    grads = np.random.default_rng(1).standard_normal((n, 4)).astype(np.float32)
    cfg = table_config(HALF)
    ram_rows = 300 * layout_of(4, "adagrad", HALF).ram_bytes
    small = Shard(ServerConfig(data_dir=str(tmp_path / "small"), cache_bytes=ram_rows, flush_interval_s=3600))
    twin = Shard(ServerConfig(data_dir=str(tmp_path / "twin"), flush_interval_s=3600))
    try:
        small.create_table(cfg)
        twin.create_table(table_config("float32"))
        for start in range(0, n, 250):
            for shard in (small, twin):
                shard.push("emb", ids[start : start + 250], grads[start : start + 250])
        assert small.table("emb").arena.evictions >= n - 300
        want = twin.pull("emb", ids)
        twin.flush()
        width = twin.table("emb").width
        want_rows = twin.store.get_rows("emb", ids, width)[1]
    finally:
        small.close()
        twin.close()
    assert not np.array_equal(rounded(want), want)  # the rounding shows
    small = Shard(ServerConfig(data_dir=str(tmp_path / "small")))
    try:
        np.testing.assert_array_equal(small.pull("emb", ids), rounded(want))
        got_rows = small.store.get_rows("emb", ids, width)[1]
        np.testing.assert_array_equal(got_rows[:, 4:], want_rows[:, 4:])  # the adagrad accumulators, statistics
        one_shard_checkpoint(small, str(tmp_path / "ckpt"), [cfg])
    finally:
        small.close()
    lines, damaged = verify_checkpoint(str(tmp_path / "ckpt"))  # its rows of the sizes the float16 layout makes
    assert not damaged, lines
    owner = SlotMap.contiguous(2).owner[slot_of(ids)]
    for shard_id in (0, 1):
        restored = Shard(ServerConfig(data_dir=str(tmp_path / f"r{shard_id}"), shard_id=shard_id, num_shards=2,
                                      restore_dir=str(tmp_path / "ckpt")))  # fmt: skip
        try:
            assert restored.table("emb").cfg.values_at_rest == HALF
            mine = owner == shard_id
            np.testing.assert_array_equal(restored.pull("emb", ids[mine]), rounded(want[mine]))
        finally:
            restored.close()
    export(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    got_ids, got = exported(tmp_path / "out", "emb")
    order = np.argsort(ids)
    np.testing.assert_array_equal(got_ids, ids[order])
    np.testing.assert_array_equal(got, rounded(want[order]))


def test_a_table_keeps_the_values_at_rest_it_was_created_with(tmp_path):
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    try:
        shard.create_table(table_config("float32"))
        with pytest.raises(TableExistsError, match=r"different spec \(existing != requested\): values_at_rest: "
                                                   r"'float32' != 'float16'$"):  # fmt: skip
            shard.create_table(table_config(HALF))
        shard.push("emb", np.array([1], np.uint64), np.ones((1, 4), np.float32))
        with pytest.raises(TableExistsError, match=r"values_at_rest: 'float32' != 'float16'; it holds 1 trained"):
            shard.create_table(table_config(HALF), replace_untrained=True)
        assert shard.table("emb").cfg.values_at_rest == "float32"
    finally:
        shard.close()
    reopened = Shard(ServerConfig(data_dir=str(tmp_path)))
    try:
        assert reopened.table("emb").cfg == table_config("float32").normalized()
    finally:
        reopened.close()


def test_values_at_rest_is_checked_read_from_toml_and_carried_by_the_spec():
    with pytest.raises(InvalidArgumentError, match=r"table 'emb': values_at_rest 'bfloat16' is unknown; expected one "
                                                   r"of \('float32', 'float16'\)"):  # fmt: skip
        TableConfig("emb", 4, values_at_rest="bfloat16").validate()
    assert TableConfig.from_dict({k: v for k, v in table_config(HALF).to_dict().items() if k != "values_at_rest"}) \
        == table_config("float32")  # a config stored before the setting: float32  # fmt: skip
    assert table_configs_from_toml('[emb]\nvalues_at_rest = "float16"\n')["emb"]["values_at_rest"] == HALF
    with pytest.raises(InvalidArgumentError, match=r"\[emb\] values_at_rest must be a string, got 16"):
        table_configs_from_toml("[emb]\nvalues_at_rest = 16\n")
    assert table_config_from_proto(table_config_to_proto(table_config(HALF))) == table_config(HALF)
    spec = table_config_to_proto(table_config(HALF))
    spec.ClearField("values_at_rest")
    assert table_config_from_proto(spec).values_at_rest == ""  # unspecified: a client that sends none


def test_a_spec_without_values_at_rest_attaches_to_either_setting_and_makes_a_float32_table(tmp_path):
    """A client that sends no values_at_rest (one older than the option) gets the table of either setting that a
    shard holds, as it is, and a new table of it is float32; a spec that names the other setting is refused."""
    unspecified = table_config_to_proto(table_config(HALF))
    unspecified.ClearField("values_at_rest")
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    try:
        shard.create_table(table_config(HALF))
        shard.push("emb", np.array([1], np.uint64), np.ones((1, 4), np.float32))
        for cfg in (table_config_from_proto(unspecified), dataclasses.replace(table_config(HALF), values_at_rest="")):
            assert shard.check_create(cfg)[0].values_at_rest == HALF
            assert shard.create_table(cfg).cfg.values_at_rest == HALF
        with pytest.raises(TableExistsError, match=r"values_at_rest: 'float16' != 'float32'"):
            shard.create_table(table_config("float32"))
        new = dataclasses.replace(table_config_from_proto(unspecified), name="other")
        assert shard.check_create(new)[0].values_at_rest == "float32"
        assert shard.create_table(new).cfg.values_at_rest == "float32"
        with pytest.raises(TableExistsError, match=r"values_at_rest: 'float32' != 'float16'"):
            shard.create_table(dataclasses.replace(new, values_at_rest=HALF))
    finally:
        shard.close()
    reopened = Shard(ServerConfig(data_dir=str(tmp_path)))
    try:
        assert reopened.table("other").cfg.values_at_rest == "float32"  # stored as made
        assert reopened.table("emb").cfg.values_at_rest == HALF
    finally:
        reopened.close()


def test_a_layout_of_an_unknown_or_unspecified_values_at_rest_is_refused():
    """Only "float32" and "float16" have a row layout; "" (unspecified) is resolved before any table is made."""
    with pytest.raises(ValueError, match=r"values_at_rest 'bfloat16' is unknown; expected 'float32' or 'float16'"):
        layout_of(4, "adagrad", "bfloat16")
    with pytest.raises(ValueError, match=r"values_at_rest '' is unknown"):
        layout_for(dataclasses.replace(table_config(HALF), values_at_rest=""))
    assert layout_for(table_config(HALF)) == layout_of(4, "adagrad", HALF)
    assert layout_for(table_config(HALF).as_new()).half_floats == 4
    assert layout_for(dataclasses.replace(table_config(HALF), values_at_rest="").as_new()).half_floats == 0


@pytest.mark.parametrize("values_at_rest, other", [(HALF, "float32"), ("float32", HALF)])
def test_rows_of_the_other_settings_size_are_named_as_maybe_written_with_it(tmp_path, values_at_rest, other):
    """A stored row of the size the table's layout has under the other values_at_rest is damage that the messages
    of a pull (Store.get_rows) and of a restore's or export's read (OddRows) say may be rows written with it; a
    row of any other odd size is not said to be."""
    layout, other_layout = layout_of(4, "adagrad", values_at_rest), layout_of(4, "adagrad", other)
    hint = f" (rows written with values_at_rest {other!r}?)"
    store = Store(str(tmp_path))
    try:
        store.create_table(table_config(values_at_rest))
        key = encode_keys(store.table_number("emb"), np.array([7], np.uint64))[0]
        for size, said in ((other_layout.value_bytes, hint), (other_layout.value_bytes + 4, "")):
            store._rows().put(key, b"\x00" * size)
            refused = rf"holds a row of {size} bytes, expected {layout.value_bytes} "
            with pytest.raises(DataLossError, match=refused) as failed:
                store.get_rows("emb", np.array([7], np.uint64), layout.width)
            assert (hint in str(failed.value)) == bool(said)
            odd = OddRows(layout)
            assert odd.saw(key, b"\x00" * size)
            with pytest.raises(CheckpointDamagedError) as failed:
                odd.check(CheckpointDamagedError, "emb")
            assert str(failed.value).endswith(f"its manifest does not match them{said}")
    finally:
        store.close()


@pytest.mark.parametrize("values_at_rest, other", [(HALF, "float32"), ("float32", HALF)])
def test_verify_names_rows_of_the_other_settings_size_as_maybe_written_with_it(tmp_path, values_at_rest, other):
    """`ps-server verify` reports a stored row of the size the table's layout has under the other values_at_rest
    as damage that may be rows written with it, as a pull and a restore do; a row of any other odd size not."""
    other_bytes = layout_of(4, "adagrad", other).value_bytes
    store = Store(str(tmp_path))
    try:
        store.create_table(table_config(values_at_rest))
        keys = encode_keys(store.table_number("emb"), np.array([7, 8], np.uint64))
        store._rows().put(keys[0], b"\x00" * other_bytes)
        store._rows().put(keys[1], b"\x00" * (other_bytes + 4))
    finally:
        store.close()
    lines, damaged = verify_data_dir(str(tmp_path))
    (said,) = [line for line in lines if line.startswith("DAMAGED")]
    assert damaged and f"stored rows of a size its layout does not make (1 of {other_bytes} bytes (rows written with " \
        f"values_at_rest {other!r}?), 1 of {other_bytes + 4} bytes; a trained row is " in said, said  # fmt: skip


@pytest.mark.parametrize("value", ["", "bfloat16", "Float16"])
def test_a_table_config_file_or_schema_with_a_values_at_rest_other_than_the_two_is_refused(value):
    """A file says float32 or float16, or leaves the key out; "" is unspecified only on the wire (a TableSpec of a
    client older than the option), which the spec test above keeps, and a file's "" is refused as any other value."""
    said = rf"\[emb\] values_at_rest '{value}' is unknown; expected one of \('float32', 'float16'\)"
    with pytest.raises(InvalidArgumentError, match=rf"^tables.toml: {said}"):
        table_configs_from_toml(f'[emb]\nvalues_at_rest = "{value}"\n', "tables.toml")
    schema = f'[tables.emb]\nvalues_at_rest = "{value}"\n[[columns]]\nname = "a"\nkind = "categorical"\ntable = "emb"\n'
    with pytest.raises(ValueError, match=rf"^s.toml \[tables\]: {said}"):
        schema_from_text(schema, "s.toml", default_table="emb", default_dim=4)
    assert table_configs_from_toml("[emb]\ndim = 4\n")["emb"].get("values_at_rest") is None  # left out: the default


class ContendedLock:
    """A lock's stand-in that sets `contended` when a thread finds it held by another and waits for it."""

    def __init__(self, lock) -> None:
        self.lock, self.contended = lock, threading.Event()

    def __enter__(self) -> ContendedLock:
        if not self.lock.acquire(blocking=False):
            self.contended.set()
            self.lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.lock.release()


def test_a_read_of_a_table_replaced_meanwhile_leaves_the_new_table_its_own_values_at_rest(tmp_path, monkeypatch):
    """A pull of the untrained float32 table 'emb' reads its misses from RocksDB without the table lock: the store
    reads the table's config to know how its rows are at rest. Right after that read, the table is replaced (from
    another thread) by a float16 one, which is then trained. Its rows are stored as float16: after a restart they
    read back, rounded; a stale float32 layout left behind by the read would have stored them at the other size."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    lock = shard.store._numbers_lock = ContendedLock(shard.store._numbers_lock)
    real_config, replaced = Store._config, threading.Event()

    def replace() -> None:
        shard.create_table(table_config(HALF), replace_untrained=True)
        replaced.set()

    def config_then_replace(self, table: str) -> TableConfig:
        cfg = real_config(self, table)
        if threading.current_thread() is reader:  # the first read only: the replace runs before this one ends
            monkeypatch.setattr(Store, "_config", real_config)
            replacing = threading.Thread(target=replace)
            replacing.start()
            while replacing.is_alive() and not lock.contended.is_set():  # done, or waiting for this read to end
                replaced.wait(0.01)
            threads.append(replacing)
        return cfg

    threads: list[threading.Thread] = []
    errors: list[BaseException] = []
    try:
        shard.create_table(table_config("float32"))
        monkeypatch.setattr(Store, "_config", config_then_replace)

        def pull() -> None:
            try:
                shard.pull("emb", np.array([7], np.uint64))
            except BaseException as e:
                errors.append(e)

        reader = threading.Thread(target=pull)
        reader.start()
        reader.join(60)
        for t in threads:
            t.join(60)
        assert replaced.is_set() and not reader.is_alive()
        assert [type(e) for e in errors] in ([], [ShardClosingError])  # the pull ran on, or met the replace
        assert shard.table("emb").cfg.values_at_rest == HALF
        grads = np.array([[0.1, 0.2, 0.3, 0.4]], np.float32)
        shard.push("emb", np.array([7], np.uint64), grads)
        want = shard.pull("emb", np.array([7], np.uint64))
    finally:
        shard.close()
    reopened = Shard(ServerConfig(data_dir=str(tmp_path)))
    try:
        np.testing.assert_array_equal(reopened.pull("emb", np.array([7], np.uint64)), rounded(want))
    finally:
        reopened.close()
