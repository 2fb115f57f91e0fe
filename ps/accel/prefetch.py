"""A software prefetch for compiled loops that visit rows of a large array in random order.

Optional: correctness never depends on it. `prefetch_row(a, i)` is a hint (LLVM's llvm.prefetch): it never
faults, whatever address it names, reads nothing into the program and writes nothing. On a CPU with no prefetch
instruction (say RISC-V without Zicbop) LLVM compiles it to nothing, and the loops compute the same, with only
as many cache misses in flight as the CPU overlaps by itself.

Why: the hot path's loops (index lookup, row gather, the in-place update) each take a cache miss per id, and a
simple loop lets the CPU overlap only a few of them. Asking for the row of the id AHEAD places later keeps more
misses in flight. prefetch_row asks for the first and the last element of row i of a 2-D array: an arena line
spans up to four cache lines, and the hardware's adjacent-line prefetcher brings the middle ones.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

AHEAD = 16  # ids ahead: far enough for a row to arrive before its turn, near enough to stay in cache


def _prefetch(builder, pointer, for_write: bool) -> None:
    i8p = ir.IntType(8).as_pointer()
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    # (address, 0 read / 1 write, locality 3 = keep in all cache levels, 1 = data cache)
    builder.call(
        fn, [builder.bitcast(pointer, i8p), ir.Constant(i32, int(for_write)), ir.Constant(i32, 3), ir.Constant(i32, 1)]
    )


def _row_prefetcher(name: str, for_write: bool):
    def typer(typingctx, array, row):
        if not (isinstance(array, types.Array) and array.ndim == 2 and isinstance(row, types.Integer)):
            return None
        sig = types.void(array, row)

        def codegen(context, builder, signature, args):
            arytype = signature.args[0]
            ary = context.make_array(arytype)(context, builder, args[0])
            row_index = context.cast(builder, args[1], signature.args[1], types.intp)
            zero = context.get_constant(types.intp, 0)
            last = builder.sub(builder.extract_value(ary.shape, 1), context.get_constant(types.intp, 1))
            for col in (zero, last):
                pointer = cgutils.get_item_pointer2(
                    context, builder, data=ary.data, shape=cgutils.unpack_tuple(builder, ary.shape),
                    strides=cgutils.unpack_tuple(builder, ary.strides), layout=arytype.layout,
                    inds=[row_index, col], wraparound=False,
                )  # fmt: skip
                _prefetch(builder, pointer, for_write)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = typer.__qualname__ = name  # numba keys an intrinsic (and its cache entries) by its name
    return intrinsic(typer)


prefetch_row = _row_prefetcher("prefetch_row", False)  # prefetch_row(a, i): row i of 2-D a, about to be read
prefetch_row_for_write = _row_prefetcher("prefetch_row_for_write", True)  # ... about to be written
