"""IdQueue against a plain list: the same entries in the same order after any mix of takes and bounded appends,
and an array that stays within its bound."""

import numpy as np
import pytest

from ps.storage.idqueue import MIN_ROOM, SPARE, IdQueue


def test_matches_a_list_under_random_takes_and_appends():
    rng = np.random.default_rng(7)
    q, oracle = IdQueue(), []
    for step in range(3000):
        if rng.random() < 0.4 and len(oracle):
            k = int(rng.integers(0, len(oracle) + 1))
            q.take(k)
            del oracle[:k]
        else:
            new = rng.integers(0, 2**64, int(rng.integers(0, 300)), dtype=np.uint64)
            keep = int(rng.integers(1, 2000))
            q.extend(new, keep)
            oracle = (oracle + new.tolist())[-keep:]
            assert len(q._buf) <= keep + keep // SPARE + MIN_ROOM  # 10 bytes per id it may keep, at most
        assert len(q) == len(oracle)
        assert q.ids.tolist() == oracle, step


def test_in_place_writes_through_the_view_are_kept():
    q = IdQueue()
    q.extend(np.arange(10, dtype=np.uint64), keep=100)
    q.ids[3:5] = [7, 7]  # as the probation scan moves kept entries up
    q.take(3)
    assert q.ids.tolist() == [7, 7, 5, 6, 7, 8, 9]


def test_more_new_ids_than_keep_keeps_the_newest():
    q = IdQueue()
    q.extend(np.arange(5, dtype=np.uint64), keep=10)
    q.extend(np.arange(100, 120, dtype=np.uint64), keep=10)
    assert q.ids.tolist() == list(range(110, 120))


def test_take_more_than_it_holds_is_refused():
    q = IdQueue()
    q.extend(np.arange(3, dtype=np.uint64), keep=10)
    with pytest.raises(ValueError):
        q.take(4)


def test_a_full_queue_taken_and_appended_alike_moves_once_per_few_calls():
    """A queue at its bound that loses from the front what it gains at the back (one-off ids) moves its entries
    about once per quarter of its length appended, whatever array the filling left it in."""
    q = IdQueue()
    q.extend(np.arange(800, dtype=np.uint64), 1000)
    q.extend(np.arange(200, dtype=np.uint64), 1000)  # full: 1000 ids
    moves = 0
    for k in range(100):
        q.take(100)
        before = q._head
        q.extend(np.arange(100, dtype=np.uint64) + 10**6 * k, 1000)
        moves += q._head < before
    assert len(q) == 1000 and moves <= 40, moves


def test_a_lower_keep_shrinks_the_array():
    q = IdQueue()
    q.extend(np.arange(10**5, dtype=np.uint64), 10**5)
    q.extend(np.zeros(0, dtype=np.uint64), 1000)
    assert len(q) == 1000 and len(q._buf) <= 1000 + 1000 // SPARE + MIN_ROOM
    assert q.ids.tolist() == list(range(10**5 - 1000, 10**5))
