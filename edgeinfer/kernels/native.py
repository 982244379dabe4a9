"""Calls from compiled code into kernels chosen at run time, by their native addresses.

The layer loop (edgeinfer/layers.py) runs a matrix product whose kernel depends on each
tensor's quant type, plain or flash attention, and ops that only some architectures use.
Calling a dispatcher from a jitted function would link the callee's LLVM IR into the
caller and optimize and compile it again (fusing the q/k/v products into one prange cost
3.2 s of compile per tuple size), and choosing among kernels at run time would link them
all. So the loop receives each kernel's address and calls it with numba's own calling
convention: no dispatch, nothing compiled twice, nothing compiled that the model does not
use.

Both sides take the argument types from one table, SIGNATURES: `address` compiles (or
loads from the cache) a kernel's overload for exactly those types, and `call` refuses to
compile a call site whose arguments differ (a writable array where the kernel takes a
read-only one, or a C-contiguous one where it takes any layout, are the differences allowed:
the same data model). A mistake is then a TypingError at compile time, never a call with the
wrong layout.
"""

from __future__ import annotations

import ctypes

import numpy as np
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic


def _array(dtype, ndim: int, readonly: bool = False) -> types.Array:
    return types.Array(dtype, ndim, "C", readonly=readonly)


_F32_1, _F32_2, _F32_3 = (_array(types.float32, n) for n in (1, 2, 3))
_I32_1, _I32_2 = _array(types.int32, 1), _array(types.int32, 2)
# one layer of the F16 KV cache (n_blocks, B, n_kv, hd), stored head-major (model.KVCache):
# any layout whose head dimension is contiguous; a C-contiguous array fits too
_KV = types.Array(types.uint16, 4, "A")

SIGNATURES: dict[str, tuple[types.Type, ...]] = {
    # registry.py: kernel(w, xq, xd, xs, xf, out), the weight rows read-only (the GGUF map)
    "matmul": (_array(types.uint8, 2, readonly=True), _array(types.int8, 2), _F32_2, _F32_2,
               _F32_2, _F32_2),
    # registry.py: quantizer(x, xq, xd, xs, xf)
    "quantize": (_F32_2, _array(types.int8, 2), _F32_2, _F32_2, _F32_2),
    # attention / flash_attention(q, k_cache, v_cache, slots, tables, positions, window,
    # scale, scores, shared, out, task), task the address of an "attention_task" of the same
    # module, tables each slot's cache blocks
    "attention": (_F32_3, _KV, _KV, _I32_1, _I32_2, _I32_1, types.int64, types.float32,
                  _F32_2, _F32_1, _F32_3, types.int64),
    # (mode, task, counters, n_seg, n_items, chunk, n_part, longest, q, k_cache, v_cache,
    # slots, tables, positions, window, scale, work, split, out): a share of a parallel
    # attention call
    "attention_task": (types.int64,) * 8 + (_F32_3, _KV, _KV, _I32_1, _I32_2, _I32_1,
                                            types.int64, types.float32, _F32_2, _F32_1,
                                            _F32_3),
    # the ops.py / attention.py kernels of the layer loop
    "rms_norm": (_F32_2, _F32_1, types.float64, _F32_2),  # (x, weight, eps, out)
    "rms_norm_inplace": (_F32_2, _F32_1, types.float64),  # (x, weight, eps)
    "rope": (_F32_3, _I32_1, _F32_2, _F32_2, types.boolean),  # (x, positions, cos, sin, neox)
    "scale_inplace": (_F32_3, types.float64),  # (x, factor)
    "add_inplace": (_F32_2, _F32_2),  # (x, y)
    "add_bias": (_F32_2, _F32_1),  # (x, bias)
    "store_kv": (_F32_3, _F32_3, _I32_1, _I32_2, _I32_1, _KV, _KV),  # (k, v, slots, tables,
    # positions, k_cache, v_cache)
    "swiglu": (_F32_2, _F32_2, _F32_2),  # (gate, up, out)
    "geglu": (_F32_2, _F32_2, _F32_1, _F32_2),  # (gate, up, table, out)
}


_KERNELS: dict[int, object] = {}  # address -> dispatcher, for calls from Python


def address(kernel, kind: str) -> int:
    """The native address of `kernel`'s overload for SIGNATURES[kind], compiled if needed."""
    cres = kernel.get_compile_result(types.none(*SIGNATURES[kind]))
    addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
    _KERNELS[addr] = kernel
    return addr


def call_from_python(kind: str, addr: int, args: tuple) -> None:
    """`call` for Python (a jitted caller's py_func, in tests): through the dispatcher."""
    _KERNELS[int(addr)](*args)


def weight_rows_from_python(addr: int, n_rows: int, n_cols: int) -> np.ndarray:
    """`weight_rows` for Python."""
    buf = (ctypes.c_uint8 * int(n_rows * n_cols)).from_address(int(addr))
    rows = np.frombuffer(buf, np.uint8).reshape(n_rows, n_cols)
    rows.flags.writeable = False
    return rows


def _fits(given: types.Type, wanted: types.Type) -> bool:
    if isinstance(given, types.Array) and isinstance(wanted, types.Array):
        if given.layout == "C" and wanted.layout == "A":  # the same data model
            given = given.copy(layout="A")
        return given.copy(readonly=not wanted.mutable) == wanted
    return given == wanted


@intrinsic(prefer_literal=True)
def call(typingctx, kind, addr, args):
    """call(kind, addr, (arg, ...)): the kernel at addr, an `address(..., kind)`, on args;
    errors it raises propagate to the caller."""
    if not isinstance(kind, types.StringLiteral) or kind.literal_value not in SIGNATURES:
        raise TypingError(f"native.call: kind must be one of {sorted(SIGNATURES)}")
    wanted = SIGNATURES[kind.literal_value]
    given = tuple(args) if isinstance(args, types.BaseTuple) else ()
    if len(given) != len(wanted) or not all(map(_fits, given, wanted)):
        raise TypingError(f"native.call({kind.literal_value!r}): arguments {given} do not "
                          f"fit {wanted}")

    def codegen(context, builder, sig, llargs):
        values = cgutils.unpack_tuple(builder, llargs[2], len(wanted))
        fnty = context.call_conv.get_function_type(types.none, wanted)
        fn = builder.inttoptr(llargs[1], fnty.as_pointer())
        status, _ = context.call_conv.call_function(builder, fn, types.none, wanted, values)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()

    return types.none(kind, types.intp, args), codegen


@intrinsic
def weight_rows(typingctx, addr, n_rows, n_cols):
    """A read-only (n_rows, n_cols) uint8 C array over the memory at addr (a weight matrix
    the caller keeps alive: the GGUF map)."""
    arrty = SIGNATURES["matmul"][0]

    def codegen(context, builder, sig, llargs):
        ptr, rows, cols = llargs
        ary = context.make_array(arrty)(context, builder)
        intp = context.get_value_type(types.intp)
        context.populate_array(
            ary, data=builder.inttoptr(ptr, ary.data.type),
            shape=cgutils.pack_array(builder, [rows, cols]),
            strides=cgutils.pack_array(builder, [cols, intp(1)]),
            itemsize=intp(1), meminfo=None)
        return ary._getvalue()

    return arrty(types.intp, types.intp, types.intp), codegen
