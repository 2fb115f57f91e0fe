import numpy as np
import pytest

from ps.rows.finite import first_non_finite


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_first_non_finite_matches_numpy(bad):
    rng = np.random.default_rng(0)
    for _trial in range(20):
        a = (rng.standard_normal((rng.integers(1, 300), 16)) * 10.0 ** rng.integers(-30, 30)).astype(np.float32)
        for pos in rng.choice(a.size, size=rng.integers(0, 4), replace=False):
            a.reshape(-1)[pos] = bad
        want = np.flatnonzero(~np.isfinite(a.reshape(-1)))
        assert first_non_finite(a) == (int(want[0]) if len(want) else -1)


def test_extremes_are_finite():
    a = np.array(
        [np.finfo(np.float32).max, -np.finfo(np.float32).max, np.finfo(np.float32).tiny, 1e-45, -0.0], np.float32
    )
    assert first_non_finite(a) == -1
    assert first_non_finite(np.zeros(0, np.float32)) == -1
