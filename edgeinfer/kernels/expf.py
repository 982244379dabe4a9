"""ggml's vectorized exp (ggml_v_expf, ggml-cpu/vec.h) as a Numba function, bit for bit.

llama.cpp exponentiates with it in the softmax and in SiLU (ggml_v_silu), so the bits of
P and of the SwiGLU activations follow from it. Written as scalar f32 code with explicit
FMAs and no branches that LLVM cannot turn into selects: inlined into an element loop, it
vectorizes like the intrinsics it mirrors (the libm expf numpy's exp calls does not).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c with one rounding (llvm.fma: vfmadd, vectorizable)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3),
                                            "llvm.fma.f32")
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def _bits_to_f32(typingctx, bits):
    """int32 bit pattern -> float32 (bitcast)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


def _hex32(text):
    return np.float32(float.fromhex(text))


_SHIFTER = _hex32("0x1.8p23")
_LOG2E, _LN2_HI, _LN2_LO = _hex32("0x1.715476p+0"), _hex32("0x1.62e4p-1"), _hex32("0x1.7f7d1cp-20")
_C1, _C2, _C3 = _hex32("0x1.ffffecp-1"), _hex32("0x1.fffdb6p-2"), _hex32("0x1.555e66p-3")
_C4, _C5 = _hex32("0x1.573e2ep-5"), _hex32("0x1.0e4020p-7")


@njit(cache=True, nogil=True)
def _pow2(m):
    """2^m for an integral f32 m in [-126, 127], built from its exponent bits."""
    return _bits_to_f32((np.int32(m) + np.int32(127)) << np.int32(23))


@njit(cache=True, nogil=True, inline="always")  # no fastmath: exactly these operations
def expf(x):
    """exp(x) in f32, bit for bit the AVX-512 build's ggml_v_expf (ARM-derived, 1.45 + 0.5
    ulp; the AVX2 and NEON builds end in fma(j, k, k) instead and differ by 1 ulp on about a
    quarter of inputs): j * 2^n as _mm512_scalef_ps computes it, in two exact steps so that
    n = 128 still gives a finite j * 2^128 and larger n overflow to inf as there. One
    difference: results below 2^-126 (x < -87.3) are not gradual like scalef's but stay
    under 2e-38, far below F16's smallest subnormal and below anything added to 1 in SiLU,
    so the softmax's P and sums and SiLU's outputs come out the same."""
    z = _fma(x, _LOG2E, _SHIFTER)
    n = z - _SHIFTER  # round(x / ln2)
    b = _fma(-n, _LN2_LO, _fma(-n, _LN2_HI, x))
    u = b * b
    j = _fma(_fma(_fma(_C5, b, _C4), u, _fma(_C3, b, _C2)), u, _fma(_C1, b, np.float32(1.0)))
    m = n if n >= np.float32(-126.0) else np.float32(-126.0)  # NaN and -inf: a finite m
    m = m if m <= np.float32(192.0) else np.float32(192.0)
    low = min(m, np.float32(127.0))
    scaled = j * _pow2(low) * _pow2(m - low)  # the second factor is 1 unless n > 127
    if n > np.float32(192.0):  # ggml's |n| > 192 case (an ordered compare: not for NaN)
        return np.float32(np.inf)
    if n < np.float32(-192.0):
        return np.float32(0.0)
    return scaled  # NaN for a NaN x, as scalef(NaN, NaN)
