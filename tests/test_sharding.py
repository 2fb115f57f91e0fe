import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ps.hashing import mix64
from ps.sharding import NUM_SLOTS, SlotMap, slot_of

u64 = st.integers(min_value=0, max_value=2**64 - 1)


def test_mix64_matches_scalar_reference():
    def ref(z):
        m = 2**64 - 1
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    ids = [0, 1, 256, 2**63, 2**64 - 1, 123456789]
    assert mix64(np.array(ids, dtype=np.uint64)).tolist() == [ref(i) for i in ids]


def test_sequential_ids_spread_evenly_over_slots_and_shards():
    ids = np.arange(1_000_000, dtype=np.uint64)
    counts = np.bincount(slot_of(ids), minlength=NUM_SLOTS)
    # as even as random placement (Poisson: std = sqrt(mean)), no empty slot
    assert counts.min() > 0 and counts.std() < 1.2 * np.sqrt(counts.mean())
    strided = np.arange(0, 16384 * 1000, 16384, dtype=np.uint64)  # ids that `id % NUM_SLOTS` puts on one slot
    assert len(np.unique(slot_of(strided))) > 900
    shards = np.bincount(SlotMap.contiguous(7).shard_of(ids), minlength=7)
    assert np.abs(shards / len(ids) - 1 / 7).max() < 0.01


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, NUM_SLOTS])
def test_contiguous_map_gives_each_slot_one_owner_in_ranges(n):
    m = SlotMap.contiguous(n)
    assert m.num_shards == n
    assert np.all(np.diff(m.owner) >= 0)  # contiguous ranges in shard order
    sizes = np.bincount(m.owner, minlength=n)
    assert sizes.sum() == NUM_SLOTS and sizes.max() - sizes.min() <= 1
    assert sorted(np.concatenate([m.slots_of_shard(i) for i in range(n)]).tolist()) == list(range(NUM_SLOTS))


@given(st.lists(u64, min_size=1, max_size=50), st.integers(1, 100))
def test_owner_is_a_function_of_the_slot(ids, n):
    ids = np.array(ids, dtype=np.uint64)
    m = SlotMap.contiguous(n)
    owners = m.shard_of(ids)
    assert ((owners >= 0) & (owners < n)).all()
    assert (owners == m.owner[slot_of(ids)]).all()


def test_bad_maps_are_rejected():
    with pytest.raises(ValueError, match="num_shards"):
        SlotMap.contiguous(0)
    with pytest.raises(ValueError, match="entries"):
        SlotMap(np.zeros(10))
