"""ps.accel.hugepages.zeros: the arrays the hot path reads at random, on huge pages where the OS grants them."""

from __future__ import annotations

import numpy as np

from ps.accel import hugepages


def test_large_arrays_are_zeroed_writable_and_shaped_like_numpys():
    a = hugepages.zeros((1 << 20, 3), np.uint64)  # 24 MB: mapped and advised
    assert a.shape == (1 << 20, 3) and a.dtype == np.uint64 and a.flags.writeable and a.flags.c_contiguous
    assert not a.any()
    a[123_456, 2] = 7
    view = a.view(np.uint8)  # the layout views the arena takes of its lines still work
    assert view.shape == (1 << 20, 24) and int(view[123_456, 16]) == 7


def test_small_arrays_are_plain_numpy():
    a = hugepages.zeros((10, 4), np.float32)
    assert a.base is None  # np.zeros, no mapping of its own
    np.testing.assert_array_equal(a, np.zeros((10, 4), np.float32))
