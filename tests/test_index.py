import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

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
