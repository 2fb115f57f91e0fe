"""ps.rows.parallel: parts cover a batch exactly; errors surface; split kernels agree with one thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ps.rows import parallel
from ps.storage.arena import Arena
from ps.storage.budget import MemoryBudget


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 1001])
def test_parts_cover_the_range_once(n):
    ranges = parallel.parts(n)
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert len(ranges) == max(1, min(parallel.THREADS, n))


def test_run_each_runs_concurrently_and_raises_after_all_finish():
    seen, barrier = [], threading.Barrier(3, timeout=10)

    def fn(i):
        barrier.wait()  # deadlocks (times out) unless the 3 calls run at the same time
        seen.append(i)
        if i == 0:
            raise ValueError("part 0 failed")
        return i

    with pytest.raises(ValueError, match="part 0"):
        parallel.run_each(fn, 3)
    assert sorted(seen) == [0, 1, 2]
    assert parallel.run_each(lambda i: i * i, 3) == [0, 1, 4]


def _arena(n_rows: int) -> Arena:
    a = Arena(4, MemoryBudget(1 << 26))
    rows = a.grow(n_rows, a.new_stamp())
    ids = np.arange(n_rows, dtype=np.uint64) * np.uint64(7919)
    a.install(rows, ids, np.arange(4 * n_rows, dtype=np.float32).reshape(n_rows, 4),
              np.zeros(n_rows, np.uint64), np.zeros(n_rows, np.uint8), 1)  # fmt: skip
    return a


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_split_lookup_finds_the_first_repeat_like_one_thread(threads, monkeypatch):
    monkeypatch.setattr(parallel, "THREADS", threads)
    a = _arena(500)
    rng = np.random.default_rng(threads)
    for _ in range(50):
        ids = rng.integers(0, 700, 200).astype(np.uint64) * np.uint64(7919)  # hits, misses and repeats
        rows, dup = a.lookup(ids, a.new_stamp())
        expected_rows = np.where(ids // np.uint64(7919) < 500, (ids // np.uint64(7919)).astype(np.int64), -1)
        np.testing.assert_array_equal(rows, expected_rows)
        hit = np.flatnonzero(rows >= 0)
        _, first = np.unique(ids[hit], return_index=True)
        repeats = np.setdiff1d(np.arange(len(hit)), first)
        assert dup == (int(hit[repeats.min()]) if len(repeats) else -1)


@pytest.mark.parametrize("threads", [1, 3])
def test_split_gather_copies_every_hit(threads, monkeypatch):
    monkeypatch.setattr(parallel, "THREADS", threads)
    a = _arena(300)
    ids = np.arange(400, dtype=np.uint64)[::-1] * np.uint64(7919)
    out = np.full((400, 4), -1.0, dtype=np.float32)
    assert a.gather_hits(ids, 4, out) == 100
    k = (ids // np.uint64(7919)).astype(np.int64)
    np.testing.assert_array_equal(out[k < 300], a.data[k[k < 300], :4])
    assert (out[k >= 300] == -1).all()
