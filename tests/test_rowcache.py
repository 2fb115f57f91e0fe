"""RowCache against a dict oracle under random operations (contents, stamps, hits, the byte budget), and its
eviction against an LRU of the same size on Zipf-distributed ids."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from worker.idslots import SLOT_BYTES, IdSlots, evict_lfu
from worker.rowcache import RowCache

DIMS = {"a": 3, "b": 5}


def entry_bytes(dim: int) -> int:
    return 4 * dim + 8 + SLOT_BYTES


def check_against(cache: RowCache, oracle: dict[str, dict[int, tuple[np.ndarray, int]]], exact: bool) -> None:
    """Every entry of the cache holds the oracle's last row and stamp of its id; exact: and nothing is missing."""
    for t, model in oracle.items():
        ids, rows, stamps = cache.contents(t)
        assert set(ids.tolist()) <= set(model), f"{t}: ids cached that were never stored or were invalidated"
        if exact:
            assert sorted(model) == ids.tolist()
        if len(ids):
            np.testing.assert_array_equal(rows, np.stack([model[i][0] for i in ids.tolist()]))
            assert stamps.tolist() == [model[i][1] for i in ids.tolist()]
    assert cache.bytes_used == sum(len(cache.contents(t)[0]) * entry_bytes(d) for t, d in DIMS.items())
    assert cache.bytes_used <= cache.capacity_bytes


def random_operations(cache: RowCache, seed: int, steps: int = 600, pool: int = 300, exact: bool = True) -> None:
    rng = np.random.default_rng(seed)
    universe = np.unique(rng.integers(0, 2**64 - 1, pool, dtype=np.uint64, endpoint=True))
    universe[:2] = (0, 1)  # the smallest ids too (2**64 - 1 is likely not drawn: set it)
    universe[-1] = np.uint64(2**64 - 1)
    oracle: dict[str, dict[int, tuple[np.ndarray, int]]] = {t: {} for t in DIMS}
    hits = misses = saved = 0
    for clock in range(steps):
        t = ("a", "b")[rng.integers(2)]
        ids = np.unique(rng.choice(universe, rng.integers(0, 40)))
        op = rng.random()
        if op < 0.45:
            rows = rng.standard_normal((len(ids), DIMS[t])).astype(np.float32)
            before = set(cache.contents(t)[0].tolist())
            cache.store(t, ids, rows, clock)
            after = set(cache.contents(t)[0].tolist())
            assert before & set(ids.tolist()) <= after  # ids held already are replaced, never evicted
            for i, r in zip(ids.tolist(), rows):
                if i in after:
                    oracle[t][i] = (r, clock)
        elif op < 0.9:
            min_stamp = int(rng.integers(0, clock + 2))
            held, _, stamps = cache.contents(t)
            fresh = {i for i, s in zip(held.tolist(), stamps.tolist()) if s >= min_stamp}
            rows, hit = cache.lookup(t, ids, min_stamp)
            expected = np.array([i in fresh for i in ids.tolist()], bool)
            np.testing.assert_array_equal(hit, expected)
            zero = np.zeros(DIMS[t], np.float32)
            want = [oracle[t][i][0] if h else zero for i, h in zip(ids.tolist(), hit)]
            np.testing.assert_array_equal(rows, np.stack(want) if want else rows)
            hits, misses = hits + int(hit.sum()), misses + int((~hit).sum())
            saved += int(hit.sum()) * (4 * DIMS[t] + 8)
        else:
            cache.invalidate(t, ids)
            for i in ids.tolist():
                oracle[t].pop(i, None)
        assert (cache.hits, cache.misses, cache.bytes_saved) == (hits, misses, saved)
        check_against(cache, oracle, exact)
    assert hits > 50 and misses > 50  # the run exercised both


@pytest.mark.parametrize("seed", [0, 1])
def test_random_operations_match_a_dict_oracle(seed):
    cache = RowCache(1 << 30, DIMS)
    random_operations(cache, seed)
    assert cache.hit_rate == cache.hits / (cache.hits + cache.misses)


@pytest.mark.parametrize("seed", [2, 3])
def test_under_a_small_budget_the_cache_holds_a_subset_of_the_oracle_and_never_passes_the_budget(seed):
    capacity = 40 * entry_bytes(3) + 30 * entry_bytes(5) + 7  # far fewer entries than the 2 x 300 ids
    cache = RowCache(capacity, DIMS, decay_every=5)
    random_operations(cache, seed, exact=False)
    assert cache.bytes_used > capacity - 2 * entry_bytes(5)  # it fills the budget, not much less


def test_store_copies_rows_and_rejects_repeated_ids():
    cache = RowCache(1 << 20, DIMS)
    ids, rows = np.array([5, 9], np.uint64), np.ones((2, 3), np.float32)
    cache.store("a", ids, rows, 7)
    rows[:] = 2
    got, hit = cache.lookup("a", np.array([5, 9, 11], np.uint64), 7)
    assert hit.tolist() == [True, True, False] and (got[:2] == 1).all() and (got[2] == 0).all()
    assert not cache.lookup("a", ids, 8)[1].any()  # stale: stamp 7 < 8
    cache.store("a", np.array([9, 3], np.uint64), rows[:2], 9)  # unsorted is fine when unique
    with pytest.raises(ValueError, match="repeats ids"):
        cache.store("a", np.array([4, 4], np.uint64), rows, 1)


def zipf_stream(seed: int, batches: int, batch: int, universe: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.permutation(universe).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # rank -> an id
    out = []
    for _ in range(batches):
        ranks = rng.zipf(1.2, batch)
        out.append(np.unique(ids[ranks[ranks <= universe] - 1]))
    return out


def lru_hit_rate(stream: list[np.ndarray], size: int, fifo: bool = False) -> float:
    held: OrderedDict[int, None] = OrderedDict()
    hits = total = 0
    for ids in stream:
        missed = []
        for i in ids.tolist():
            total += 1
            if i in held:
                hits += 1
                if not fifo:
                    held.move_to_end(i)
            else:
                missed.append(i)
        for i in missed:
            held[i] = None
            if len(held) > size:
                held.popitem(last=False)
    return hits / total


def cache_hit_rate(stream: list[np.ndarray], cache: RowCache) -> float:
    for clock, ids in enumerate(stream):
        rows, hit = cache.lookup("a", ids, 0)
        cache.store("a", ids[~hit], np.zeros((int((~hit).sum()), 3), np.float32), clock)
    return cache.hit_rate


def test_on_zipf_ids_frequency_aware_eviction_beats_lru_and_fifo_of_the_same_size():
    stream = zipf_stream(seed=4, batches=300, batch=400, universe=200_000)
    size = 1500
    cache = RowCache(size * entry_bytes(3), {"a": 3})
    ours = cache_hit_rate(stream, cache)
    lru, fifo = lru_hit_rate(stream, size), lru_hit_rate(stream, size, fifo=True)
    assert len(cache) == size
    assert ours > lru + 0.02 and ours > fifo + 0.02, (ours, lru, fifo)


def test_a_hot_id_survives_a_scan_of_one_off_ids_and_old_hot_ids_leave_after_decay():
    size = 200
    cache = RowCache(size * entry_bytes(3), {"a": 3}, decay_every=16)

    def one_offs(first: int, stores: int) -> None:
        for k in range(stores):  # 50 ids seen once per store, a quarter of the cache
            part = np.arange(first + 50 * k, first + 50 * k + 50, dtype=np.uint64)
            cache.lookup("a", part, 0)
            cache.store("a", part, np.zeros((50, 3), np.float32), 100)

    hot = np.array([7, 8], np.uint64)
    for clock in range(100):
        rows, hit = cache.lookup("a", hot, 0)
        cache.store("a", hot[~hit], np.ones((int((~hit).sum()), 3), np.float32), clock)
    one_offs(1000, 40)  # 10 x the cache's size: an LRU or FIFO would have dropped the hot ids
    assert cache.lookup("a", hot, 0)[1].all()
    assert lru_hit_rate([hot, np.arange(1000, 3000, dtype=np.uint64), hot], size) == 0
    one_offs(10_000, 200)  # no more uses: 12 halvings bring their frequency to 0, and one-off ids push them out
    assert not cache.lookup("a", hot, 0)[1].any()


def test_eviction_takes_the_least_frequent_entries_of_any_table():
    """Table b's entries are used often, a's once: a store to b past the budget evicts from a."""
    cache = RowCache(50 * entry_bytes(3) + 50 * entry_bytes(5), DIMS)
    a_ids, b_ids = np.arange(50, dtype=np.uint64), np.arange(100, 150, dtype=np.uint64)
    cache.store("a", a_ids, np.zeros((50, 3), np.float32), 0)
    cache.store("b", b_ids, np.zeros((50, 5), np.float32), 0)
    for _ in range(5):
        cache.lookup("b", b_ids, 0)
    cache.store("b", np.arange(200, 210, dtype=np.uint64), np.zeros((10, 5), np.float32), 1)
    assert len(cache.contents("b")[0]) == 60 and len(cache.contents("a")[0]) < 50
    assert cache.bytes_used <= cache.capacity_bytes


def test_id_slots_reuse_freed_slots_and_keep_pinned_entries():
    slots = IdSlots()
    ids = np.arange(10, dtype=np.uint64) * np.uint64(2**60 + 1)
    got = slots.add(ids)
    assert got.tolist() == list(range(10)) and slots.find(ids).tolist() == got.tolist()
    assert slots.remove(ids[:3]) == 3 and slots.remove(ids[:3]) == 0
    assert (slots.find(ids[:3]) == -1).all() and slots.find(ids[3:]).tolist() == got[3:].tolist()
    assert sorted(slots.add(np.array([1, 2], np.uint64)).tolist()) == [1, 2]  # freed slots first
    saved = slots.pin(got[3:])
    assert evict_lfu([slots], [1], 100) == 2  # only the two unpinned entries can go
    slots.unpin(got[3:], saved)
    assert len(slots) == 7 and slots.find(ids[3:]).tolist() == got[3:].tolist()
    many = np.arange(1000, 100_000, dtype=np.uint64)  # the index grows and rehashes
    added = slots.add(many)
    np.testing.assert_array_equal(slots.find(many), added)
    assert slots.find(ids[3:]).tolist() == got[3:].tolist() and len(slots) == 7 + len(many)


def test_id_slots_compaction_moves_the_owners_arrays_with_the_entries():
    """The owner's arrays passed to compact_if_sparse come back moved as the entries: each id's slot after it holds
    that id's row; arrays that are not sparse come back as they are, the very objects."""
    slots = IdSlots()
    ids = np.arange(1000, dtype=np.uint64) * np.uint64(7919)
    added = slots.add(ids)
    rows, stamps = np.zeros((slots.capacity, 3), np.float32), np.zeros(slots.capacity, np.int64)
    rows[added], stamps[added] = ids[:, None].astype(np.float32), ids.astype(np.int64)
    assert all(a is b for a, b in zip(slots.compact_if_sparse(rows, stamps), (rows, stamps), strict=True))
    assert slots.remove(ids[np.arange(1000) % 10 != 3]) == 900  # 100 entries left, in slots up to 993
    kept = ids[3::10]
    moved_rows, moved_stamps = slots.compact_if_sparse(rows, stamps)
    at = slots.find(kept)
    assert slots.capacity == len(moved_rows) == len(moved_stamps) == 100 and sorted(at.tolist()) == list(range(100))
    np.testing.assert_array_equal(moved_rows[at], np.repeat(kept[:, None].astype(np.float32), 3, axis=1))
    np.testing.assert_array_equal(moved_stamps[at], kept.astype(np.int64))


def test_tables_taking_the_budget_in_turn_leave_no_arrays_sized_for_it_behind():
    """8 tables, each filling the whole budget in its turn (its ids hot, the others' not used any more): the entries
    of the tables before leave, and their arrays shrink with them, so the arrays of all 8 stay within twice the
    budget (without the shrink each table kept arrays for the whole budget: 2.1 x it by the third)."""
    dims = {f"t{i}": 9 for i in range(8)}
    capacity = 20_000 * entry_bytes(9)
    cache = RowCache(capacity, dims)
    for phase, t in enumerate(dims):
        for k in range(6):  # 30,000 new ids a phase: past the budget's 20,000 entries
            ids = np.arange(5000, dtype=np.uint64) + np.uint64(10**9 * phase + 5000 * k)
            cache.store(t, ids, np.full((5000, 9), phase, np.float32), phase)
            assert cache.bytes_used <= capacity
        got, hit = cache.lookup(t, ids, phase)
        assert hit.all() and (got == phase).all()  # the entries moved with the shrink kept their rows
        assert cache.allocated_bytes <= 2 * capacity, (phase, cache.allocated_bytes / capacity)
    for phase, t in enumerate(dims):  # what each table still holds is its own rows, at their own stamps
        ids, rows, stamps = cache.contents(t)
        assert (ids // np.uint64(10**9) == phase).all() and (rows == phase).all() and (stamps == phase).all()
    assert len(cache) > 15_000
