"""ps.accel.prefetch: a hint inside compiled loops; it compiles for the arrays the hot path uses and never faults."""

import numba
import numpy as np
import pytest

from ps.accel.prefetch import prefetch_row, prefetch_row_for_write


@numba.njit
def _gather_prefetching(a, rows, ahead):
    out = np.empty((rows.shape[0], a.shape[1]), a.dtype)
    for i in range(rows.shape[0]):
        prefetch_row(a, rows[i] + ahead)  # far past the end for a large ahead: must not fault
        prefetch_row_for_write(a, -rows[i] - ahead)
        for j in range(a.shape[1]):
            out[i, j] = a[rows[i], j]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.uint64, np.uint8])
@pytest.mark.parametrize("ahead", [1, 1 << 40])
def test_prefetching_changes_nothing_and_never_faults(dtype, ahead):
    a = np.arange(6 * 42).astype(dtype).reshape(6, 42)
    rows = np.array([5, 0, 3, 3], dtype=np.int64)
    before = a.copy()
    np.testing.assert_array_equal(_gather_prefetching(a, rows, ahead), a[rows])
    np.testing.assert_array_equal(a, before)


def test_non_contiguous_arrays_and_other_index_types():
    a = np.arange(10 * 8, dtype=np.float32).reshape(10, 8)[:, 2:5]  # strided rows
    np.testing.assert_array_equal(_gather_prefetching(a, np.array([9, 1], dtype=np.int32), 3), a[[9, 1]])


def test_the_hint_is_a_prefetch_instruction():
    @numba.njit
    def first_of_each(a, rows):
        s = 0.0
        for i in range(rows.shape[0]):
            prefetch_row(a, rows[i])  # an int32 index, as given
            s += a[rows[i], 0]
        return s

    a = np.ones((4, 8), dtype=np.float32)
    assert first_of_each(a, np.array([3, 1], dtype=np.int32)) == 2.0
    (asm,) = first_of_each.inspect_asm().values()
    assert "prefetch" in asm
