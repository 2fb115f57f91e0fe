import numpy as np

from ps.config import InitializerConfig
from ps.rows.initializers import init_rows


def _init(cfg, ids, dim=8):
    out = np.full((len(ids), dim + 3), 7.0, dtype=np.float32)
    init_rows(cfg, np.asarray(ids, dtype=np.uint64), out, dim)
    return out


def test_initial_rows_are_a_pure_function_of_seed_and_id():
    ids = np.array([0, 1, 256, 2**64 - 1], dtype=np.uint64)
    cfg = InitializerConfig("uniform", 0.1, seed=3)
    a, b = _init(cfg, ids), _init(cfg, ids[::-1])
    assert np.array_equal(a, b[::-1])
    assert not np.array_equal(a, _init(InitializerConfig("uniform", 0.1, seed=4), ids))
    assert len({tuple(r) for r in a[:, :8]}) == 4  # distinct ids, distinct rows
    assert (a[:, 8:] == 7.0).all()  # columns past dim untouched


def test_uniform_and_normal_have_the_requested_spread():
    ids = np.arange(20000, dtype=np.uint64)
    u = _init(InitializerConfig("uniform", 0.5), ids)[:, :8]
    assert u.min() >= -0.5 and u.max() <= 0.5 and abs(u.mean()) < 0.01
    assert abs(u.std() - 0.5 / np.sqrt(3)) < 0.01
    n = _init(InitializerConfig("normal", 2.0), ids)[:, :8]
    assert abs(n.mean()) < 0.05 and abs(n.std() - 2.0) < 0.05
    assert (_init(InitializerConfig("zeros", 1.0), ids)[:, :8] == 0).all()
