import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.index import IdIndex

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


def test_index_grows_past_many_doublings():
    ids = np.random.default_rng(1).permutation(200_000).astype(np.uint64) * np.uint64(16384)  # one slot's ids
    index = IdIndex(capacity=8)
    index.insert(ids, np.arange(len(ids)))
    assert (index.lookup(ids) == np.arange(len(ids))).all()
    assert len(index) == len(ids) and index.keys.size <= 4 * 262144
