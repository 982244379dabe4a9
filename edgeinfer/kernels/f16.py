"""IEEE half-precision conversions usable inside Numba kernels.

Numba's CPU target has no float16 type, so F16 data (KV cache, F16 weights, ggml scales) is
carried as uint16 bits. Where the CPU converts halves itself (F16C on x86, every ARM64), the
conversions bitcast to LLVM `half` and extend/truncate, which LLVM lowers to `vcvtph2ps` /
`vcvtps2ph` or `fcvt`: exact, vectorizable, round-to-nearest-even like ggml's
GGML_FP32_TO_FP16. Elsewhere (NUMBA_CPU_NAME=generic, x86 before F16C) LLVM would call
compiler-rt helpers that Numba's JIT does not provide, so the same conversions are written
out in integer and float operations (F. Giesen's half_to_float and float_to_half_fast3_rtne).
`half_to_f32` and `f32_to_half` build the IR, on scalars or vectors, for the kernels' own
intrinsics too.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from edgeinfer.kernels.target import F16_NATIVE

_I16, _I32, _F32, _HALF = ir.IntType(16), ir.IntType(32), ir.FloatType(), ir.HalfType()


def _typed(value: ir.Value):
    """(type maker, constant maker) for scalars or vectors shaped like value."""
    n = value.type.count if isinstance(value.type, ir.VectorType) else 0

    def ty(t):
        return ir.VectorType(t, n) if n else t

    def const(t, c):
        return ir.Constant(ty(t), [c] * n if n else c)

    return ty, const


def half_to_f32(builder: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """i16 IEEE half bits (scalar or vector) -> f32, exact."""
    ty, const = _typed(bits)
    if F16_NATIVE:
        return builder.fpext(builder.bitcast(bits, ty(_HALF)), ty(_F32))
    h = builder.zext(bits, ty(_I32))
    shifted = builder.shl(builder.and_(h, const(_I32, 0x7FFF)), const(_I32, 13))
    value = builder.fmul(builder.bitcast(shifted, ty(_F32)), const(_F32, 2.0**112))  # rebias
    is_special = builder.fcmp_ordered(">=", value, const(_F32, 65536.0))  # was inf or NaN
    mag = builder.bitcast(value, ty(_I32))
    mag = builder.select(is_special, builder.or_(mag, const(_I32, 0x7F800000)), mag)
    sign = builder.shl(builder.and_(h, const(_I32, 0x8000)), const(_I32, 16))
    return builder.bitcast(builder.or_(mag, sign), ty(_F32))


def f32_to_half(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """f32 (scalar or vector) -> i16 half bits, rounded to nearest even; NaN stays NaN."""
    ty, const = _typed(value)
    if F16_NATIVE:
        return builder.bitcast(builder.fptrunc(value, ty(_HALF)), ty(_I16))
    u = builder.bitcast(value, ty(_I32))
    sign = builder.and_(u, const(_I32, 0x80000000))
    a = builder.xor(u, sign)  # |value| bits
    big = builder.icmp_unsigned(">=", a, const(_I32, (127 + 16) << 23))  # overflow, inf, NaN
    inf_nan = builder.select(builder.icmp_unsigned(">", a, const(_I32, 255 << 23)),
                             const(_I32, 0x7E00), const(_I32, 0x7C00))
    # subnormal results: adding 0.5 (bits 126 << 23) aligns the 10 mantissa bits at the
    # bottom and the float add rounds them to nearest even
    sub = builder.fadd(builder.bitcast(a, ty(_F32)), const(_F32, 0.5))
    sub = builder.sub(builder.bitcast(sub, ty(_I32)), const(_I32, 126 << 23))
    odd = builder.and_(builder.lshr(a, const(_I32, 13)), const(_I32, 1))
    norm = builder.add(builder.add(a, const(_I32, ((15 - 127) << 23) + 0xFFF)), odd)
    norm = builder.lshr(norm, const(_I32, 13))
    small = builder.icmp_unsigned("<", a, const(_I32, 113 << 23))  # subnormal or zero
    out = builder.select(big, inf_nan, builder.select(small, sub, norm))
    out = builder.or_(out, builder.lshr(sign, const(_I32, 16)))
    return builder.trunc(out, ty(_I16))


@intrinsic
def f16_bits_to_f32(typingctx, bits):
    """uint16 bits -> float32 (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return half_to_f32(builder, args[0])

    return sig, codegen


@intrinsic
def f32_to_f16_bits(typingctx, value):
    """float32 -> uint16 bits, rounded to nearest even."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return f32_to_half(builder, args[0])

    return sig, codegen


@njit(inline="always", nogil=True)
def round_f16(value):
    """float32 rounded to the nearest float16 value, returned as float32."""
    return f16_bits_to_f32(f32_to_f16_bits(value))
