"""Device primitives the CUDA kernels share: integer dot products, bit casts, byte loads and
reductions, each with the inline-PTX/LLVM form the GPU runs and a plain-Python form that
numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1, the CI's way of running them) runs instead.

The simulator has no `@intrinsic`, no warp shuffles and runs integer arithmetic as numpy
scalars; so every helper here takes and returns int64 or float32 values, and the choice of
form is made once, at import, by `SIM`.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, types

SIM = bool(cuda.config.ENABLE_CUDASIM)
WARP = 32
I64 = np.int64


# ---- the plain-Python forms (simulator; also valid device code, slower)

def _dp4a_py(a, b, c):
    """c + the dot of the four signed bytes of a and b (int64 holding 32 bits)."""
    s = c
    for i in range(4):
        x = (a >> (8 * i)) & 0xFF
        y = (b >> (8 * i)) & 0xFF
        s += (x - 256 if x >= 128 else x) * (y - 256 if y >= 128 else y)
    return s


def _f16_py(bits):
    return np.float32(np.array([bits], np.uint16).view(np.float16)[0])


def _f32_py(bits):
    return np.array([bits], np.uint32).view(np.float32)[0]


if SIM:
    dp4a = cuda.jit(device=True)(_dp4a_py)
    f16_from_bits = cuda.jit(device=True)(_f16_py)
    f32_from_bits = cuda.jit(device=True)(_f32_py)
else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    @intrinsic
    def dp4a(typingctx, a, b, c):
        """dp4a.s32.s32: c + four signed 8-bit products (sm_61+), on the low 32 bits of a, b."""
        sig = types.int64(a, b, c)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            a32, b32, c32 = (builder.trunc(context.cast(builder, v, t, types.int64), i32)
                             for v, t in zip(args, sig.args))
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32] * 3),
                               "dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r")
            return builder.sext(builder.call(asm, [a32, b32, c32]), ir.IntType(64))
        return sig, codegen

    @intrinsic
    def f16_from_bits(typingctx, bits):
        """The float32 value of IEEE half bits (the low 16 bits of an integer)."""
        sig = types.float32(bits)

        def codegen(context, builder, sig, args):
            v = builder.trunc(context.cast(builder, args[0], sig.args[0], types.int64),
                              ir.IntType(16))
            return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())
        return sig, codegen

    @intrinsic
    def f32_from_bits(typingctx, bits):
        """The float32 value of IEEE single bits (the low 32 bits of an integer)."""
        sig = types.float32(bits)

        def codegen(context, builder, sig, args):
            v = builder.trunc(context.cast(builder, args[0], sig.args[0], types.int64),
                              ir.IntType(32))
            return builder.bitcast(v, ir.FloatType())
        return sig, codegen


# ---- loads from GGML blocks (uint8 rows); widened first: numpy's uint8 shifts wrap

@cuda.jit(device=True, inline="always")
def u16(w, row, off):
    return I64(w[row, off]) | (I64(w[row, off + 1]) << 8)


@cuda.jit(device=True, inline="always")
def u32(w, row, off):
    return (I64(w[row, off]) | (I64(w[row, off + 1]) << 8) | (I64(w[row, off + 2]) << 16)
            | (I64(w[row, off + 3]) << 24))


@cuda.jit(device=True, inline="always")
def half(w, row, off):
    """An F16 field of a block as float32."""
    return f16_from_bits(u16(w, row, off))


@cuda.jit(device=True, inline="always")
def to_i32(v):
    """The low 32 bits of v as a signed value (what an int32 array can hold)."""
    v = v & 0xFFFFFFFF
    return v - 0x100000000 if v >= 0x80000000 else v


# ---- reductions across a block's threads. On the GPU a warp reduces with shuffles; the
# simulator has none, so there the values go through shared memory (`red`, one float per
# thread of the block) and each thread adds them up: three barriers, which the simulator
# makes costly. Every thread of the block must call them (they synchronize).

@cuda.jit(device=True)
def _block_sum_shared(v, red, tid, n):
    cuda.syncthreads()
    red[tid] = v
    cuda.syncthreads()
    s = red[0]
    for i in range(1, n):
        s += red[i]
    cuda.syncthreads()
    return s


@cuda.jit(device=True)
def _block_max_shared(v, red, tid, n):
    cuda.syncthreads()
    red[tid] = v
    cuda.syncthreads()
    s = red[0]
    for i in range(1, n):
        s = max(s, red[i])
    cuda.syncthreads()
    return s


@cuda.jit(device=True)
def _warp_sum_shfl(v):
    for off in (16, 8, 4, 2, 1):
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, off)
    return v


@cuda.jit(device=True)
def _warp_max_shfl(v):
    for off in (16, 8, 4, 2, 1):
        v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, off))
    return v


@cuda.jit(device=True)
def _block_sum_shfl(v, red, tid, n):
    """n a multiple of 32, at most 32 warps."""
    v = _warp_sum_shfl(v)
    cuda.syncthreads()
    if tid % WARP == 0:
        red[tid // WARP] = v
    cuda.syncthreads()
    s = red[tid % WARP] if tid % WARP < n // WARP else np.float32(0)
    s = _warp_sum_shfl(s)
    cuda.syncthreads()
    return s


@cuda.jit(device=True)
def _block_max_shfl(v, red, tid, n):
    v = _warp_max_shfl(v)
    cuda.syncthreads()
    if tid % WARP == 0:
        red[tid // WARP] = v
    cuda.syncthreads()
    s = red[tid % WARP] if tid % WARP < n // WARP else np.float32(-np.inf)
    s = _warp_max_shfl(s)
    cuda.syncthreads()
    return s


@cuda.jit(device=True)
def _warp_sums_shared(acc, red, tid):
    """acc[i] = its sum over the 32 threads of tid's warp, for every i, through red
    (len(acc), threads of the block): each thread adds its warp's 32 values itself."""
    cuda.syncthreads()
    for i in range(acc.shape[0]):
        red[i, tid] = acc[i]
    cuda.syncthreads()
    first = tid - tid % WARP
    for i in range(acc.shape[0]):
        s = red[i, first]
        for j in range(1, WARP):
            s += red[i, first + j]
        acc[i] = s
    cuda.syncthreads()


@cuda.jit(device=True)
def _warp_sums_shfl(acc, red, tid):
    for i in range(acc.shape[0]):
        acc[i] = _warp_sum_shfl(acc[i])


if SIM:
    block_sum, block_max = _block_sum_shared, _block_max_shared
    warp_sums = _warp_sums_shared
else:
    block_sum, block_max = _block_sum_shfl, _block_max_shfl
    warp_sums = _warp_sums_shfl
