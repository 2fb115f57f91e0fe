"""The RAM of the rows a Shrink drops: given back to the shard's budget, for any table to take (ps.storage.arena
return_free), while the rows kept stay as they were."""

import numpy as np
import pytest

from ps.config import EvictionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.engine.shrinkprogress import ShrinkProgress
from ps.errors import StorageError
from ps.rows.layout import layout_of
from ps.server_config import ServerConfig


def shrinkable_table(name: str, dim: int = 8) -> TableConfig:
    """A table of zeros trained by sgd (lr 1), whose ids not pushed for 5 steps a Shrink drops."""
    return TableConfig(
        name, dim, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0), eviction=EvictionConfig(ttl_steps=5)
    )


@pytest.fixture
def pushed_500(tmp_path):
    """(shard, table a): a shard with RAM for 1,000 rows, table a on it, ids 0..499 pushed at step 0 and the clock
    at 10, so that a Shrink drops every id not pushed again."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path), flush_interval_s=3600,
                               cache_bytes=1000 * layout_of(8, "sgd").ram_bytes))  # fmt: skip
    try:
        a = shard.create_table(shrinkable_table("a"))
        shard.push("a", np.arange(500, dtype=np.uint64), np.ones((500, 8), np.float32))
        shard.advance_clock(10)
        yield shard, a
    finally:
        shard.close()


def test_the_rows_a_shrink_drops_give_their_ram_to_the_other_tables(tmp_path):
    """Tables a and b share a RAM tier of 20,000 rows, 10,000 each: their shares. A Shrink drops all but a's 100
    ids pushed last. Stats then count a's RAM as those 100 rows, and b takes the 9,900 others: 19,000 of its ids
    stay in RAM, none evicted; a's kept rows and its new ids are as pushed."""
    budget_rows = 20_000
    shard = Shard(ServerConfig(data_dir=str(tmp_path), flush_interval_s=3600,
                               cache_bytes=budget_rows * layout_of(8, "sgd").ram_bytes))  # fmt: skip
    try:
        a, b = shard.create_table(shrinkable_table("a")), shard.create_table(shrinkable_table("b"))
        ids = np.arange(10_000, dtype=np.uint64)
        for name in ("a", "b"):
            shard.push(name, ids, np.ones((10_000, 8), np.float32))
        shard.advance_clock(10)
        kept = ids[-100:]  # the last rows of a's arena: they move down when the rows under them go
        shard.push("a", kept, np.ones((100, 8), np.float32))
        row_charge = a.arena.row_charge
        assert shard.shrink("a")["dropped"] == 9_900
        assert (a.stats()["rows_in_ram"], a.stats()["ram_bytes"]) == (100, 100 * row_charge)
        np.testing.assert_array_equal(a.peek(kept)[:, :8], -2.0)
        more = np.arange(10_000, 19_000, dtype=np.uint64)
        shard.push("b", more, np.ones((9_000, 8), np.float32))  # 19,000 rows: 9,000 past its share
        assert (b.stats()["rows_in_ram"], b.stats()["evictions"]) == (19_000, 0)
        shard.push("a", more[:50], np.ones((50, 8), np.float32))  # a grows again, from the bytes left free
        np.testing.assert_array_equal(a.peek(np.concatenate([kept, more[:50]]))[:, :8],
                                      np.repeat([[-2.0], [-1.0]], [100, 50], axis=0) * np.ones(8))  # fmt: skip
        assert shard.budget.used_bytes == (a.arena.used + b.arena.used) * row_charge <= shard.budget.limit_bytes
    finally:
        shard.close()


def test_a_shrink_whose_table_arrays_cannot_shrink_still_gives_the_rows_back_and_succeeds(pushed_500, caplog):
    """The arrays get no memory to shrink into once the dropped rows left them: the Shrink still answers, what it
    dropped stays dropped, the log says what happened, and the budget counts exactly the rows in use."""
    shard, a = pushed_500
    shard.push("a", np.arange(10, dtype=np.uint64), np.ones((10, 8), np.float32))
    resize = a.arena._resize

    def no_memory_to_shrink(capacity: int) -> None:
        if capacity < a.arena.capacity:
            raise MemoryError(f"no pages for {capacity} rows")
        resize(capacity)

    a.arena._resize = no_memory_to_shrink
    assert shard.shrink("a")["dropped"] == 490
    assert "table 'a' gave 490 free rows back to the budget; shrinking its arrays" in caplog.text
    assert a.arena.used == 10 and shard.budget.used_bytes == 10 * a.arena.row_charge
    np.testing.assert_array_equal(a.peek(np.arange(12, dtype=np.uint64))[:, :8],
                                  np.repeat([[-2.0], [0.0]], [10, 2], axis=0) * np.ones(8))  # fmt: skip


def test_a_shrink_that_fails_part_way_still_gives_back_the_ram_of_the_rows_it_dropped(pushed_500):
    """A Shrink of 500 rows in chunks of 100 whose third chunk's write fails: the error comes out, the 200 ids the
    first two chunks dropped stay dropped, and their RAM rows go back to the budget (none left free and charged)."""
    shard, a = pushed_500
    shard.flush()
    write_shrink, calls = a.writer.write_shrink, []

    def fails_third(*args) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise StorageError("the third chunk's write failed")
        write_shrink(*args)

    a.writer.write_shrink = fails_third
    with pytest.raises(StorageError):
        a.shrink(shard.clock, ShrinkProgress(["a"]), chunk_rows=100)
    assert a.counters["dropped"] == 200 and len(a.arena.free) == 0
    assert a.arena.used == 300 and shard.budget.used_bytes == 300 * a.arena.row_charge
