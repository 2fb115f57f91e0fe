import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.accel import hugepages
from ps.storage.index import IdIndex

u64 = st.integers(0, 2**64 - 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.one_of(u64, st.integers(0, 50)), max_size=40), max_size=12))
def test_index_matches_a_dict_under_random_batches(batches):
    index, model, next_row = IdIndex(capacity=4), {}, 0
    for batch in batches:
        ids = np.array(list(dict.fromkeys(batch)), dtype=np.uint64)  # unique within a call
        rows = np.arange(next_row, next_row + len(ids), dtype=np.int64)
        next_row += len(ids)
        index.insert(ids, rows)
        model.update(zip(ids.tolist(), rows.tolist()))
        probe = np.array(batch + [2**64 - 2, 12345678901], dtype=np.uint64)
        assert index.lookup(probe).tolist() == [model.get(i, -1) for i in probe.tolist()]
        assert len(index) == len(model)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 40), max_size=12)), max_size=25))
def test_insert_and_delete_match_a_dict(ops):
    index, model, row = IdIndex(capacity=8), {}, 0  # few keys in a small table: long probe runs, wrap-around
    for is_delete, batch in ops:
        ids = np.array(list(dict.fromkeys(batch)), dtype=np.uint64)
        if is_delete:
            index.delete(ids)
            for i in ids.tolist():
                model.pop(i, None)
        else:
            index.insert(ids, np.arange(row, row + len(ids)))
            model.update(zip(ids.tolist(), range(row, row + len(ids))))
            row += len(ids)
        probe = np.arange(41, dtype=np.uint64)
        assert index.lookup(probe).tolist() == [model.get(i, -1) for i in range(41)]
        assert len(index) == len(model)


def test_index_grows_past_many_doublings():
    ids = np.random.default_rng(1).permutation(200_000).astype(np.uint64) * np.uint64(16384)  # one slot's ids
    index = IdIndex(capacity=8)
    index.insert(ids, np.arange(len(ids)))
    assert (index.lookup(ids) == np.arange(len(ids))).all()
    assert len(index) == len(ids) and len(index.slots) <= 4 * 262144


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(u64, st.integers(0, 300)), min_size=1, max_size=300, unique=True), st.data())
def test_a_shrink_after_deletes_keeps_every_entry_left(ids, data):
    index = IdIndex(capacity=4 * len(ids))  # room for many more: a shrink lays the entries out in a smaller table
    index.insert(np.array(ids, dtype=np.uint64), np.arange(len(ids)))
    gone = data.draw(st.sets(st.sampled_from(ids)))
    index.delete(np.array(sorted(gone), dtype=np.uint64))
    index.shrink(0)
    model = {i: r for r, i in enumerate(ids) if i not in gone}
    assert len(index.slots) == 1 << index.bits <= max(16, 4 * len(model))
    probe = np.array(ids + [2**64 - 2], dtype=np.uint64)
    assert index.lookup(probe).tolist() == [model.get(i, -1) for i in probe.tolist()]
    assert len(index) == len(model)


def test_a_shrink_whose_array_cannot_be_resized_keeps_the_index_whole(monkeypatch):
    ids = np.random.default_rng(2).permutation(5000).astype(np.uint64) * np.uint64(16384)
    index = IdIndex(capacity=len(ids))
    index.insert(ids, np.arange(len(ids)))
    index.delete(ids[100:])
    size = len(index.slots)

    def no_memory(owner, name, rows):
        raise MemoryError("no memory for the smaller copy")

    monkeypatch.setattr(hugepages, "resize", no_memory)
    with pytest.raises(MemoryError):
        index.shrink(0)
    assert len(index.slots) == size == 1 << index.bits
    assert index.lookup(ids).tolist() == list(range(100)) + [-1] * (len(ids) - 100)


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc/self/clear_refs")
def test_a_doubling_holds_no_more_than_the_new_array():
    """The RAM tier charges a row 4 index slots (INDEX_BYTES_PER_ROW): the doubling of an index at its load of 1/2
    grows the process by the slots it adds (the array resized in place), not by a second array beside the first
    and copies of its entries."""
    n = (1 << 19) - 10  # 2**20 slots (16 MiB) at load 1/2: the next insert doubles them to 2**21
    ids = np.random.default_rng(3).permutation(4 * n)[:n].astype(np.uint64)
    index = IdIndex(capacity=8)
    index.insert(ids, np.arange(n))
    assert len(index.slots) == 1 << 20
    more = np.arange(4 * n, 4 * n + 1000, dtype=np.uint64)
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM from here
        f.write("5")
    before = _status_bytes("VmRSS")
    index.insert(more, np.arange(n, n + 1000))
    grown = _status_bytes("VmHWM") - before
    assert len(index.slots) == 1 << 21 and len(index) == n + 1000
    added = (1 << 20) * 16
    assert grown < added + (4 << 20), f"the doubling grew the RSS by {grown / 2**20:.1f} MiB, adding 16 MiB of slots"
    assert (index.lookup(ids) == np.arange(n)).all() and (index.lookup(more) == np.arange(n, n + 1000)).all()
