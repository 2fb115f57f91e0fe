"""ps.accel.hugepages.zeros: the arrays the hot path reads at random, on huge pages where the OS grants them, and
the same zero-filled arrays on ordinary pages where it does not."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

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


def _like_np_zeros(a: np.ndarray, shape: tuple[int, ...], dtype: type) -> None:
    assert a.shape == shape and a.dtype == dtype and a.flags.writeable and a.flags.c_contiguous
    assert not a.any()
    a[-1, -1] = 5
    assert int(a.sum()) == 5


def test_where_the_kernel_refuses_the_advice_the_array_is_on_ordinary_pages(monkeypatch):
    """A kernel without transparent huge pages answers madvise(MADV_HUGEPAGE) with EINVAL, as it does to this
    unknown advice: the mapping stays, on 4 KB pages."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("this Python has no madvise advice for huge pages (not Linux)")
    with pytest.raises(OSError):
        mmap.mmap(-1, mmap.PAGESIZE).madvise(0x7FFF)
    monkeypatch.setattr(mmap, "MADV_HUGEPAGE", 0x7FFF)
    a = hugepages.zeros((1 << 20, 3), np.uint64)
    assert a.base is not None  # a mapping of its own, whose advice was refused
    _like_np_zeros(a, (1 << 20, 3), np.uint64)


def test_where_python_has_no_huge_page_advice_the_array_is_np_zeros(monkeypatch):
    monkeypatch.delattr(mmap, "MADV_HUGEPAGE", raising=False)  # not Linux
    a = hugepages.zeros((1 << 20, 3), np.uint64)
    assert a.base is None
    _like_np_zeros(a, (1 << 20, 3), np.uint64)


def test_release_gives_back_the_whole_pages_past_a_row_and_keeps_the_rows_before():
    """Rows from 1,000 of a mapped array written with ones: released, the whole pages past row 1,000 read zeros
    again (the kernel dropped them), the rows before keep their ones; a small (np.zeros) array is left as it is."""
    if not hasattr(mmap, "MADV_DONTNEED"):
        pytest.skip("this Python has no MADV_DONTNEED (not Linux)")
    a = hugepages.zeros((1 << 20, 3), np.uint64)
    a[:] = 1
    hugepages.release(a, 1000)
    first = -(-1000 * 24 // mmap.PAGESIZE) * mmap.PAGESIZE // 24 + 1  # the first row wholly on a page released
    assert (a[:1000] == 1).all() and not a[first:].any()
    small = np.ones((10, 3), np.uint64)
    hugepages.release(small, 0)
    assert (small == 1).all()
