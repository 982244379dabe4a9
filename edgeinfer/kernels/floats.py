"""Matrix-product kernels for float weights: F32, F16 and BF16.

Each has the registry's uniform signature `kernel(w, xq, xd, xs, xf, out)` and writes
out[t, r] = dot(w[r], x[t]) for every token t and output row r, from the f32 activations xf
(F16 and BF16 weights meet activations rounded to their type, as ggml's vec_dot_f16/bf16
do). The sums are f32, as ggml's on x86: 'reassoc' lets LLVM split each across SIMD lanes
as ggml does, 'contract' lets it use FMA. The quantized types are in legacy.py and
kquants.py.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from edgeinfer.kernels.actquant import BF16_ACT, F16_ACT, F32_ACT
from edgeinfer.kernels.f16 import half_to_f32
from edgeinfer.kernels.registry import register

_I32, _F32 = ir.IntType(32), ir.FloatType()


@intrinsic
def _weight_to_f32(typingctx, v):
    """One float weight as f32, by storage dtype: float32 as is; int16 = IEEE half bits (the
    F16 wrapper's view, numba has no float16 type on CPU); uint16 = bfloat16 bits."""
    if v not in (types.float32, types.int16, types.uint16):
        return None

    def codegen(context, builder, signature, args):
        (value,) = args
        if signature.args[0] == types.float32:
            return value
        if signature.args[0] == types.int16:
            return half_to_f32(builder, value)
        return builder.bitcast(builder.shl(builder.zext(value, _I32), _I32(16)), _F32)

    return types.float32(v), codegen


FLOAT_ROWS_PER_CHUNK = 16  # output rows per prange task of the float kernel
_FLOAT_MATH = {"reassoc", "contract"}  # lane-split sums and FMA, as ggml's SIMD dot products


@njit(parallel=True, cache=True, nogil=True, fastmath=_FLOAT_MATH)
def matmul_float(w, xq, xd, xs, xf, out) -> None:
    """w (n_out, n_in) float32, or int16 / uint16 bits of F16 / BF16: the kernels below."""
    n_tok, n_out = out.shape
    n_in = w.shape[1]  # xf may be wider (shared scratch space)
    n_quad = n_tok // 4
    for c in prange((n_out + FLOAT_ROWS_PER_CHUNK - 1) // FLOAT_ROWS_PER_CHUNK):
        r_end = min(c * FLOAT_ROWS_PER_CHUNK + FLOAT_ROWS_PER_CHUNK, n_out)
        for t in range(0, n_quad * 4, 4):  # 4 tokens per converted weight (prefill)
            for r in range(c * FLOAT_ROWS_PER_CHUNK, r_end):
                a0 = a1 = a2 = a3 = np.float32(0.0)
                for i in range(n_in):
                    v = _weight_to_f32(w[r, i])
                    a0 += v * xf[t, i]
                    a1 += v * xf[t + 1, i]
                    a2 += v * xf[t + 2, i]
                    a3 += v * xf[t + 3, i]
                out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = a0, a1, a2, a3
        for t in range(n_quad * 4, n_tok):  # 4 rows at a time: the same loop shape as above,
            # so LLVM splits each sum across the same lanes and a row's result does not
            # depend on the batch (a plain one-row loop got wider interleaving on AVX2)
            r_first = c * FLOAT_ROWS_PER_CHUNK
            for r in range(r_first, r_end, 4):
                r = max(min(r, r_end - 4), 0)
                r1, r2, r3 = min(r + 1, n_out - 1), min(r + 2, n_out - 1), min(r + 3, n_out - 1)
                a0 = a1 = a2 = a3 = np.float32(0.0)
                for i in range(n_in):
                    x = xf[t, i]
                    a0 += _weight_to_f32(w[r, i]) * x
                    a1 += _weight_to_f32(w[r1, i]) * x
                    a2 += _weight_to_f32(w[r2, i]) * x
                    a3 += _weight_to_f32(w[r3, i]) * x
                out[t, r], out[t, r1], out[t, r2], out[t, r3] = a0, a1, a2, a3


# Every weight reaches its kernel as its raw (n_out, row_bytes) bytes (registry.py), so the
# float kernels view them as their float type first.
@njit(cache=True, nogil=True)
def matmul_f32(w, xq, xd, xs, xf, out) -> None:
    """F32 weights (their bytes) times f32 activations, f32 accumulation."""
    matmul_float(w.view(np.float32), xq, xd, xs, xf, out)


@njit(cache=True, nogil=True)
def matmul_f16(w, xq, xd, xs, xf, out) -> None:
    """F16 weights (their bytes) times F16-rounded activations, f32 accumulation."""
    matmul_float(w.view(np.int16), xq, xd, xs, xf, out)


@njit(cache=True, nogil=True)
def matmul_bf16(w, xq, xd, xs, xf, out) -> None:
    """BF16 weights (their bytes) times BF16-rounded activations, f32 accumulation."""
    matmul_float(w.view(np.uint16), xq, xd, xs, xf, out)


register(T.F32, F32_ACT, matmul_f32)
register(T.F16, F16_ACT, matmul_f16)
register(T.BF16, BF16_ACT, matmul_bf16)
