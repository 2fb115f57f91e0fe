import numpy as np
import pytest

from ps.accel import hugepages
from ps.storage.arena import Arena
from ps.storage.budget import MemoryBudget


def test_evicting_a_row_with_a_stale_id_keeps_the_live_entry():
    a = Arena(width=2, budget=MemoryBudget(1 << 20))
    stamp = a.new_stamp()
    rows = a.grow(2, stamp)
    ids = np.array([7, 8], dtype=np.uint64)
    a.install(rows, ids, np.zeros((2, 2), np.float32), np.zeros(2, np.uint64), np.zeros(2, np.uint8), stamp)
    a.release(rows[:1])  # id 7 dropped (Shrink); its row keeps the stale id 7
    again = a.grow(1, a.new_stamp())  # ... and is reused first
    assert again.tolist() == rows[:1].tolist()
    a.give_back(again)
    other = a.grow(2, a.new_stamp())[1:]  # a never-used row
    a.install(other, ids[:1], np.ones((1, 2), np.float32), np.zeros(1, np.uint64), np.zeros(1, np.uint8), 9)
    a.forget(rows[:1])  # evicting the stale row must not remove id 7's live entry
    assert a.index.lookup(ids).tolist() == [int(other[0]), int(rows[1])]


def test_clock_never_picks_pinned_or_free_rows():
    a = Arena(width=1, budget=MemoryBudget(1 << 20))
    stamp = a.new_stamp()
    rows = a.grow(6, stamp)
    ids = np.arange(6, dtype=np.uint64)
    a.install(rows, ids, np.zeros((6, 1), np.float32), np.zeros(6, np.uint64), np.zeros(6, np.uint8), stamp)
    a.release(rows[:2])
    later = a.new_stamp()
    a.lookup(ids[2:3], later)  # pins row 2 for the request in progress
    victims = a.victims(6, later)
    assert sorted(victims.tolist()) == [3, 4, 5]


def test_find_rows_and_first_repeat_match_an_oracle():
    a = Arena(width=1, budget=MemoryBudget(1 << 20))
    stamp = a.new_stamp()
    rows = a.grow(300, stamp)
    ids = np.arange(1000, 1300, dtype=np.uint64)
    a.install(rows, ids, np.zeros((300, 1), np.float32), np.zeros(300, np.uint64), np.zeros(300, np.uint8), stamp)
    rng = np.random.default_rng(0)
    for _trial in range(200):
        ask = rng.choice(np.arange(900, 1400, dtype=np.uint64), size=rng.integers(0, 60))
        got, misses = a.find_rows(ask)
        want = {int(i): int(r) for i, r in zip(ids, rows)}
        assert got.tolist() == [want.get(int(i), -1) for i in ask]
        assert misses == sum(int(i) not in want for i in ask)
        hits = got[got >= 0]
        seen, first = set(), -1
        for k, r in enumerate(hits.tolist()):
            if r in seen:
                first = k
                break
            seen.add(r)
        assert a.first_repeat(hits) == first  # and the bitmap is left clear for the next call
    assert not a._seen.any()


def test_a_growth_whose_arrays_get_no_memory_to_move_keeps_every_row_and_the_table_goes_on(monkeypatch):
    """The arrays of 10 rows (room for 16) cannot move to room for 32: the growth fails with MemoryError and its
    bytes go back; the rows, their ids, data and flags stay where they were, and once memory is there the table
    grows."""
    budget = MemoryBudget(1 << 20)
    a = Arena(width=2, budget=budget)
    rows = a.grow(10, a.new_stamp())
    ids = np.arange(10, dtype=np.uint64) + np.uint64(100)
    block = np.arange(20, dtype=np.float32).reshape(10, 2)
    a.install(rows, ids, block, np.arange(10, dtype=np.uint64), np.zeros(10, np.uint8), 0)
    a.dirty[[2, 5]] = 1

    def no_memory(shape: tuple, dtype: np.dtype) -> np.ndarray:
        raise MemoryError(f"no pages for {shape}")

    monkeypatch.setattr(hugepages, "zeros", no_memory)
    with pytest.raises(MemoryError):
        a.grow(20, a.new_stamp())
    assert budget.used_bytes == 10 * a.row_charge and a.used == 10 and a.capacity == 16
    assert len(a.data) == len(a.ids) == len(a.pin) == 16
    found, _ = a.lookup(ids, a.new_stamp())
    assert found.tolist() == rows.tolist()
    assert (a.data[rows, :2] == block).all() and a.lsn[rows].tolist() == list(range(10))
    assert np.flatnonzero(a.dirty[:10]).tolist() == [2, 5]
    monkeypatch.undo()
    more = a.grow(20, a.new_stamp())
    assert more.tolist() == list(range(10, 30)) and a.capacity == 32 and budget.used_bytes == 30 * a.row_charge
    assert (a.data[rows, :2] == block).all() and a.index.lookup(ids).tolist() == rows.tolist()


def _filled(n: int, budget: MemoryBudget) -> tuple[Arena, np.ndarray, np.ndarray]:
    """An arena of width 2 holding n rows of ids 100.. (row r holds [2r, 2r + 1], lsn r), and those ids and rows."""
    a = Arena(width=2, budget=budget)
    rows = a.grow(n, a.new_stamp())
    ids = np.arange(n, dtype=np.uint64) + np.uint64(100)
    block = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
    a.install(rows, ids, block, np.arange(n, dtype=np.uint64), np.zeros(n, np.uint8), 0)
    return a, ids, rows


def test_return_free_whose_index_cannot_take_the_moved_rows_moves_none_and_raises(monkeypatch):
    """Rows 0-3 of 10 are released (a Shrink's drops); the index fails to take the moved rows' entries: the error
    comes out of return_free, every row kept is where it was with its data, the free rows stay free (none holds a
    copy of a kept row's line: pin -1), and the budget still charges the 10 rows in use."""
    budget = MemoryBudget(1 << 20)
    a, ids, rows = _filled(10, budget)
    a.release(rows[:4])

    def no_memory(ids: np.ndarray, rows: np.ndarray) -> None:
        raise MemoryError("no memory for the index to grow")

    monkeypatch.setattr(a.index, "insert", no_memory)
    with pytest.raises(MemoryError):
        a.return_free()
    assert a.used == 10 and sorted(a.free.tolist()) == [0, 1, 2, 3] and a.pin[:4].tolist() == [-1] * 4
    assert a.index.lookup(ids).tolist() == [-1] * 4 + list(range(4, 10))
    assert a.data[4:10, :2].tolist() == np.arange(8, 20, dtype=np.float32).reshape(6, 2).tolist()
    assert budget.used_bytes == 10 * a.row_charge
    monkeypatch.undo()
    assert a.return_free() == 4 and a.used == 6 and budget.used_bytes == 6 * a.row_charge
    found = a.index.lookup(ids[4:])
    assert (a.data[found, :2] == np.arange(8, 20, dtype=np.float32).reshape(6, 2)).all()


def test_return_free_whose_arrays_cannot_shrink_logs_it_and_settles_the_budget(caplog):
    """The arrays get no memory to shrink into: return_free still gives the 80 free rows back (the kept rows moved
    down, found at their new rows), logs the failed shrink and returns; the arrays keep their capacity."""
    budget = MemoryBudget(1 << 20)
    a, ids, rows = _filled(100, budget)
    a.release(rows[:80])

    def no_memory(capacity: int) -> None:
        raise MemoryError(f"no pages for {capacity} rows")

    a._resize = no_memory
    assert a.return_free() == 80 and a.used == 20 and budget.used_bytes == 20 * a.row_charge
    assert a.capacity == 100 and "shrinking its arrays to the rows left failed" in caplog.text
    found = a.index.lookup(ids[80:])
    assert sorted(found.tolist()) == list(range(20))
    assert (a.data[found, :2] == np.arange(160, 200, dtype=np.float32).reshape(20, 2)).all()


def test_return_free_lets_an_error_other_than_no_memory_propagate():
    """Only the arrays' shrink is caught (MemoryError, OSError): any other error comes out of return_free."""
    budget = MemoryBudget(1 << 20)
    a, _ids, rows = _filled(100, budget)
    a.release(rows[:80])

    def broken(capacity: int) -> None:
        raise RuntimeError("a bug")

    a._resize = broken
    with pytest.raises(RuntimeError):
        a.return_free()
    assert budget.used_bytes == 20 * a.row_charge == a.used * a.row_charge


def test_return_free_of_a_few_rows_keeps_the_arrays_and_their_ghost_and_settles_the_budget():
    """10,000 rows of 200,000 (room for 300,000, the data mapped) dropped: return_free settles the budget to the
    190,000 rows left, and the arrays keep their capacity and mapping (the ghost too: no resize); the pages past
    the rows in use go back to the OS (they read zeros), and the next row pushed needs no resize."""
    budget = MemoryBudget(1 << 30)
    a, ids, rows = _filled(150_000, budget)
    more = a.grow(50_000, a.new_stamp())
    ids = np.concatenate([ids, np.arange(150_100, 200_100, dtype=np.uint64)])
    a.install(
        more,
        ids[150_000:],
        np.ones((50_000, 2), np.float32),
        np.zeros(50_000, np.uint64),
        np.zeros(50_000, np.uint8),
        0,
    )
    assert a.capacity == 300_000 and hugepages._mapping(a.data) is not None
    a._ghost[:] = 7  # what the ghost remembers: lost on a resize
    data, ghost = a.data, a._ghost
    a.release(np.arange(10_000))
    assert a.return_free() == 10_000 and a.used == 190_000 and budget.used_bytes == 190_000 * a.row_charge
    assert a.capacity == 300_000 and a.data is data and a._ghost is ghost and (a._ghost == 7).all()
    assert not a.data[190_200:].any()  # rows moved down from there: the pages past the one row 190,000 starts on
    found = a.index.lookup(ids[10_000:])
    assert (a.data[found[:140_000], :2] == np.arange(20_000, 300_000, dtype=np.float32).reshape(-1, 2)).all()
    assert (a.data[found[140_000:], :2] == 1).all()
    assert a.grow(1, a.new_stamp()).tolist() == [190_000] and a.data is data


def test_return_free_that_shrinks_the_arrays_gives_back_the_pages_past_the_rows_left():
    """500,000 rows of 600,000 dropped: the data shrinks to 200,000 rows, still a mapping of its own, and rows
    [100,000, 200,000), which held lines of dropped rows, go back to the OS: the pages past the one row 100,000
    starts on read zeros, while the rows kept hold their lines."""
    a, ids, rows = _filled(600_000, MemoryBudget(1 << 30))
    a.release(rows[:500_000])
    assert a.return_free() == 500_000 and (a.used, a.capacity) == (100_000, 200_000)
    assert hugepages._mapping(a.data) is not None
    assert not a.data[100_200:].any()
    found = a.index.lookup(ids[500_000:])
    assert (a.data[found, :2] == np.arange(1_000_000, 1_200_000, dtype=np.float32).reshape(-1, 2)).all()


def test_return_free_shrinks_the_arrays_to_twice_the_rows_left_once_under_a_quarter():
    """Of 100 rows (room for 100) 70 dropped: 30 rows fill a quarter of it or more, so the arrays keep their size;
    then 10 more dropped: 20 rows fill under a quarter, so the arrays shrink to 40 rows; then all go: none."""
    budget = MemoryBudget(1 << 20)
    a, ids, rows = _filled(100, budget)
    assert a.capacity == 100
    a.release(rows[:70])
    assert a.return_free() == 70 and (a.used, a.capacity, len(a.data), len(a.ids)) == (30, 100, 100, 100)
    a.release(a.index.lookup(ids[70:80]))
    assert a.return_free() == 10 and (a.used, a.capacity, len(a.data), len(a.ids)) == (20, 40, 40, 40)
    assert budget.used_bytes == 20 * a.row_charge
    assert (a.data[a.index.lookup(ids[80:]), :2] == np.arange(160, 200, dtype=np.float32).reshape(20, 2)).all()
    a.release(a.index.lookup(ids[80:]))
    assert a.return_free() == 20 and (a.used, a.capacity, budget.used_bytes) == (0, 0, 0)
