"""ps.accel.prefetch: a hint inside compiled loops; it compiles for the arrays the hot path uses, never faults,
changes nothing, and compiles to nothing on a CPU without a prefetch instruction."""

import numba
import numpy as np
import pytest

from ps.accel.prefetch import _prefetch, prefetch_row, prefetch_row_for_write


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


def _instructions(triple: str, features: str) -> list[str]:
    """The instructions of a function whose only work is prefetch_row's hint, compiled for triple."""
    from llvmlite import binding as llvm
    from llvmlite import ir

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        target = llvm.Target.from_triple(triple)
    except RuntimeError:
        pytest.skip(f"this LLVM has no {triple} target")
    module = ir.Module(name="hint")
    module.triple = triple
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()]), name="hint")
    builder = ir.IRBuilder(fn.append_basic_block())
    _prefetch(builder, fn.args[0], False)
    builder.ret_void()
    asm = target.create_target_machine(features=features).emit_assembly(llvm.parse_assembly(str(module)))
    lines = (line.split("#")[0].strip() for line in asm.splitlines())
    return [line.split()[0] for line in lines if line and not line.startswith(".") and not line.endswith(":")]


@pytest.mark.parametrize("features, expected", [("+zicbop", ["prefetch.r", "ret"]), ("", ["ret"])])
def test_on_a_cpu_without_a_prefetch_instruction_the_hint_compiles_to_nothing(features, expected):
    """RISC-V has a prefetch instruction only with the Zicbop extension: without it LLVM drops the hint, and a
    loop that asks for rows ahead compiles to the same loop without the asking."""
    assert _instructions("riscv64-unknown-linux-gnu", features) == expected
