"""IEEE half-precision conversions usable inside Numba kernels.

Numba's CPU target has no float16 type, so F16 data (KV cache, F16 weights, ggml scales) is
carried as uint16 bits. These intrinsics bitcast to LLVM `half` and extend/truncate, which
LLVM lowers to F16C `vcvtph2ps`/`vcvtps2ph` on x86 and to `fcvt` on ARM: exact, vectorizable,
round-to-nearest-even like ggml's GGML_FP32_TO_FP16.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


@intrinsic
def f16_bits_to_f32(typingctx, bits):
    """uint16 bits -> float32 (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        half = builder.bitcast(args[0], ir.HalfType())
        return builder.fpext(half, ir.FloatType())

    return sig, codegen


@intrinsic
def f32_to_f16_bits(typingctx, value):
    """float32 -> uint16 bits, rounded to nearest even."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        half = builder.fptrunc(args[0], ir.HalfType())
        return builder.bitcast(half, ir.IntType(16))

    return sig, codegen


@njit(inline="always", nogil=True)
def round_f16(value):
    """float32 rounded to the nearest float16 value, returned as float32."""
    return f16_bits_to_f32(f32_to_f16_bits(value))
