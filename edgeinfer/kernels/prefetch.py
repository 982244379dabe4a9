"""Software prefetch usable inside Numba kernels.

The hardware prefetcher alone leaves strided or short streams (a KV head's rows of the cache,
small quant blocks) well below DRAM bandwidth: too few misses are in flight.
`prefetch(arr, i0, i1, i2, i3)` asks for the cache line holding arr[i0, i1, i2, i3] (4-D
arrays); x86 and ARM prefetches never fault, so addresses past the end are harmless.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I32 = ir.IntType(32)


@intrinsic
def prefetch(typingctx, arr, i0, i1, i2, i3):
    """Prefetch (read, keep in all levels) the line of arr[i0, i1, i2, i3]."""
    if not isinstance(arr, types.Array) or arr.ndim != 4:
        return None
    sig = types.void(arr, i0, i1, i2, i3)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = [context.cast(builder, v, t, types.intp)
               for v, t in zip(args[1:], signature.args[1:])]
        ptr = cgutils.get_item_pointer2(context, builder, data=ary.data,
                                        shape=cgutils.unpack_tuple(builder, ary.shape, 4),
                                        strides=cgutils.unpack_tuple(builder, ary.strides, 4),
                                        layout=aryty.layout, inds=idx)
        i8p = builder.bitcast(ptr, ir.IntType(8).as_pointer())
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p.type, _I32, _I32, _I32]),
            "llvm.prefetch.p0")
        builder.call(fn, [i8p, _I32(0), _I32(3), _I32(1)])
        return context.get_dummy_value()

    return sig, codegen
