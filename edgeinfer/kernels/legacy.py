"""Matrix-product kernels for the legacy GGML types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1.

Each kernel has the registry's uniform signature `kernel(w, xq, xd, xs, xf, out)` and writes
out[t, r] = dot(w[r], x[t]) for every token t and output row r.

Integer types follow llama.cpp's AVX2 `ggml_vec_dot_*_q8_*` (ggml-cpu/arch/x86/quants.c): per
32-value block an exact integer dot product into 8 int32 lanes, converted to f32 and
accumulated with one FMA by d_w*d_x into an 8-lane f32 accumulator that lives across blocks;
the `_1` types add sum(m_w * s_x) in a scalar f32. The block loop is hand-written LLVM vector
IR (`numba.extending.intrinsic`): LLVM's auto-vectorizers were fragile on nibble formats
(kernels.md, facts 1-6). The integer dot itself is chosen once from the CPU numba targets
(DOT_PATH): `vpdpbusd` (AVX-VNNI / AVX512-VNNI), else `vpmaddubsw`+`vpmaddwd` (AVX2), both
with llama.cpp's sign trick for signed weights, else portable IR (NEON, NUMBA_CPU_NAME=generic).
All three give bit-identical results: the integer sums are exact.

Float types accumulate in f32 like ggml_vec_dot_f16/bf16/f32 on x86; 'reassoc' lets LLVM
split the sum across SIMD lanes as ggml does, 'contract' lets it use FMA.

Parallelism: `prange` over chunks of ROWS_PER_CHUNK output rows. Inside a chunk, tokens go
TOKENS_PER_CALL at a time through each row, so prefill decodes a weight block once per 4
tokens and re-reads weights from L1/L2, not DRAM.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from edgeinfer.kernels.actquant import (
    BF16_ACT,
    CPU_FEATURES,
    F16_ACT,
    F16_NATIVE,
    F32_ACT,
    Q8_0_ACT,
    Q8_1_ACT,
)
from edgeinfer.kernels.registry import register

ROWS_PER_CHUNK = 8  # output rows per prange task: weights of one chunk stay in L1/L2

_I1, _I8, _I16, _I32, _I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
_F32, _HALF = ir.FloatType(), ir.HalfType()
_V8F = ir.VectorType(_F32, 8)


def _vec(elem: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(elem, n)


def _splat(elem: ir.Type, n: int, value) -> ir.Constant:
    return ir.Constant(_vec(elem, n), [value] * n)


def _shuffle(builder, a, b, idx: list[int]):
    return builder.shuffle_vector(a, b, ir.Constant(_vec(_I32, len(idx)), idx))


def _load(builder, base, offset, ty: ir.Type):
    """Unaligned load of `ty` at byte `offset` (i64 value or int) from an i8* `base`."""
    offset = offset if isinstance(offset, ir.Value) else ir.Constant(_I64, offset)
    ptr = builder.bitcast(builder.gep(base, [offset]), ty.as_pointer())
    return builder.load(ptr, align=1)


def _half_to_f32(builder, bits):
    """i16 IEEE half bits -> f32. Hardware conversion where there is one, else the exact
    integer/float sequence from F. Giesen's half_to_float (LLVM would call a runtime helper
    that numba's JIT does not provide)."""
    if F16_NATIVE:
        return builder.fpext(builder.bitcast(bits, _HALF), _F32)
    h = builder.zext(bits, _I32)
    shifted = builder.shl(builder.and_(h, _I32(0x7FFF)), _I32(13))
    value = builder.fmul(builder.bitcast(shifted, _F32), _F32(2.0**112))  # rebias exponent
    is_special = builder.fcmp_ordered(">=", value, _F32(65536.0))  # was inf or NaN
    mag = builder.bitcast(value, _I32)
    mag = builder.select(is_special, builder.or_(mag, _I32(0x7F800000)), mag)
    sign = builder.shl(builder.and_(h, _I32(0x8000)), _I32(16))
    return builder.bitcast(builder.or_(mag, sign), _F32)


def _load_f16(builder, base, offset):
    return _half_to_f32(builder, _load(builder, base, offset, _I16))


# ---- weight block decoders: (builder, block ptr) -> <32 x i8> weights, element j = value j


def _nibbles(builder, base, offset):
    """16 bytes -> <32 x i8>: low nibbles are values 0..15, high nibbles values 16..31."""
    qs = _load(builder, base, offset, _vec(_I8, 16))
    lo = builder.and_(qs, _splat(_I8, 16, 0x0F))
    hi = builder.lshr(qs, _splat(_I8, 16, 4))
    return _shuffle(builder, lo, hi, list(range(32)))


def _high_bits(builder, base, offset):
    """uint32 qh -> <32 x i8> holding 16 where bit j of qh is set (the 5th bit of value j)."""
    qh = _load(builder, base, offset, _I32)
    bits = builder.bitcast(qh, _vec(_I1, 32))  # element j = bit j (little-endian)
    return builder.select(bits, _splat(_I8, 32, 16), _splat(_I8, 32, 0))


def _decode_q8_0(builder, blk):  # d f16 | qs int8[32]
    return _load(builder, blk, 2, _vec(_I8, 32))


def _decode_q4_0(builder, blk):  # d f16 | qs u8[16]; value = nibble - 8
    return builder.sub(_nibbles(builder, blk, 2), _splat(_I8, 32, 8))


def _decode_q4_1(builder, blk):  # d f16 | m f16 | qs u8[16]; value = d * nibble + m
    return _nibbles(builder, blk, 4)


def _decode_q5_0(builder, blk):  # d f16 | qh u32 | qs u8[16]; value = (nibble | hbit<<4) - 16
    q = builder.or_(_nibbles(builder, blk, 6), _high_bits(builder, blk, 2))
    return builder.sub(q, _splat(_I8, 32, 16))


def _decode_q5_1(builder, blk):  # d f16 | m f16 | qh u32 | qs u8[16]
    return builder.or_(_nibbles(builder, blk, 8), _high_bits(builder, blk, 4))


# ---- the block dot product and the row loop


if "avxvnni" in CPU_FEATURES or {"avx512vnni", "avx512vl"} <= CPU_FEATURES:
    DOT_PATH = "vnni"  # vpdpbusd: 32 u8*s8 products summed into 8 i32 in one instruction
elif "avx2" in CPU_FEATURES:
    DOT_PATH = "avx2"  # vpmaddubsw + vpmaddwd, llama.cpp's AVX2 path
else:
    DOT_PATH = "generic"  # portable IR; LLVM picks widening multiplies (NEON smull/sdot...)


def _call(builder, name: str, ret: ir.Type, *args):
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ret, [a.type for a in args]), name
    )
    return builder.call(fn, args)


def _dot_generic(builder, a, b):
    """Portable: sext to i16, even/odd products widened to i32 and added -> <8 x i32>."""
    a16 = builder.sext(a, _vec(_I16, 32))
    b16 = builder.sext(b, _vec(_I16, 32))
    even, odd = list(range(0, 32, 2)), list(range(1, 32, 2))

    def widened(v, idx):
        return builder.sext(_shuffle(builder, v, v, idx), _vec(_I32, 16))

    prod_e = builder.mul(widened(a16, even), widened(b16, even))
    prod_o = builder.mul(widened(a16, odd), widened(b16, odd))
    pairs = builder.add(prod_e, prod_o)  # <16 x i32>
    lo = _shuffle(builder, pairs, pairs, list(range(8)))
    hi = _shuffle(builder, pairs, pairs, list(range(8, 16)))
    return builder.add(lo, hi)


def _dot_u8s8(builder, u, s):
    """dot of unsigned bytes u with signed bytes s. u <= 128 and |s| <= 127 here, so the i16
    pair sums of vpmaddubsw (<= 32512) cannot saturate."""
    v8i32 = _vec(_I32, 8)
    if DOT_PATH == "vnni":
        zero = ir.Constant(v8i32, [0] * 8)
        ub, sb = builder.bitcast(u, v8i32), builder.bitcast(s, v8i32)
        return _call(builder, "llvm.x86.avx512.vpdpbusd.256", v8i32, zero, ub, sb)
    pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", _vec(_I16, 16), u, s)
    ones = ir.Constant(_vec(_I16, 16), [1] * 16)
    return _call(builder, "llvm.x86.avx2.pmadd.wd", v8i32, pairs, ones)


def _dot_i8x32(builder, a, b, a_unsigned: bool):
    """Exact dot of weights a and activations b (|b| <= 127) as <8 x i32> partial sums. x86: multiply |a| by b carrying a's sign (vpsignb), as llama.cpp's
    mul_sum_i8_pairs; the `_1` formats' weights are already unsigned."""
    if DOT_PATH == "generic":
        return _dot_generic(builder, a, b)
    if a_unsigned:
        return _dot_u8s8(builder, a, b)
    abs_a = _call(builder, "llvm.x86.avx2.psign.b", a.type, a, a)
    signed_b = _call(builder, "llvm.x86.avx2.psign.b", b.type, b, a)
    return _dot_u8s8(builder, abs_a, signed_b)


def _hsum8(builder, v):
    """Horizontal sum of <8 x float> in hsum_float_8's order (halves, then pairs)."""
    s4 = builder.fadd(_shuffle(builder, v, v, [0, 1, 2, 3]), _shuffle(builder, v, v, [4, 5, 6, 7]))
    s2 = builder.fadd(_shuffle(builder, s4, s4, [0, 1]), _shuffle(builder, s4, s4, [2, 3]))
    return builder.fadd(builder.extract_element(s2, _I32(0)), builder.extract_element(s2, _I32(1)))


def _prefetch(builder, ptr) -> None:
    """Software prefetch (read, keep in all levels). Small blocks carry few bytes per
    instruction, so the out-of-order window alone keeps too few cache misses in flight;
    on this machine the Q4 kernels read DRAM at half the rate of Q8_0 without it."""
    fn = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(ir.VoidType(), [ptr.type, _I32, _I32, _I32]),
        "llvm.prefetch.p0",
    )
    builder.call(fn, [ptr, _I32(0), _I32(3), _I32(1)])


def _row_ptr(context, builder, arrty, arr, t):
    """i8* to row t of a 2-D array (any row stride)."""
    ary = context.make_array(arrty)(context, builder, arr)
    stride = cgutils.unpack_tuple(builder, ary.strides, 2)[0]
    base = builder.bitcast(ary.data, _I8.as_pointer())
    return builder.gep(base, [builder.mul(t, stride)])


class _RowDot:
    """Emits dot(one weight row, n_tok consecutive tokens' Q8 activations) for one format.
    Several tokens per call decode each weight block once (prefill); one token uses two
    accumulators (even/odd blocks) to hide the FMA latency (+10-15%, kernels.md)."""

    def __init__(self, decode, block_bytes: int, has_min: bool, n_tok: int):
        self.decode, self.block_bytes, self.has_min = decode, block_bytes, has_min
        self.n_tok, self.n_acc = n_tok, 2 if n_tok == 1 else 1

    def block(self, builder, w, tokens, i, accs, summs):
        """Adds block i of every token into its vector accumulator (and m*s into summs)."""
        blk = builder.gep(w, [builder.mul(i, _I64(self.block_bytes))])
        _prefetch(builder, builder.gep(blk, [_I64(PREFETCH_BYTES)]))
        q_w, d_w = self.decode(builder, blk), _load_f16(builder, blk, 0)
        m_w = _load_f16(builder, blk, 2) if self.has_min else None
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V8F, [_V8F] * 3), "llvm.fma.v8f32"
        )
        for (xq, xd, xs), acc, summ in zip(tokens, accs, summs):
            q_x = _load(builder, xq, builder.mul(i, _I64(32)), _vec(_I8, 32))
            isum = builder.sitofp(_dot_i8x32(builder, q_w, q_x, self.has_min), _V8F)
            scale = builder.fmul(d_w, _load(builder, xd, builder.mul(i, _I64(4)), _F32))
            scale_v = builder.insert_element(ir.Constant(_V8F, None), scale, _I32(0))
            scale_v = _shuffle(builder, scale_v, scale_v, [0] * 8)
            builder.store(builder.call(fma, [isum, scale_v, builder.load(acc)]), acc)
            if self.has_min:
                s_x = _load(builder, xs, builder.mul(i, _I64(4)), _F32)
                builder.store(builder.fadd(builder.load(summ), builder.fmul(m_w, s_x)), summ)

    def emit(self, context, builder, sig, args):
        w_ty, xq_ty, xd_ty, xs_ty, _ = sig.args
        w, xq, xd, xs, t0 = args
        w_ary = context.make_array(w_ty)(context, builder, w)
        w_ptr = builder.bitcast(w_ary.data, _I8.as_pointer())
        tokens = []
        for k in range(self.n_tok):
            t = builder.add(t0, _I64(k))
            tokens.append(
                [
                    _row_ptr(context, builder, ty, a, t)
                    for ty, a in ((xq_ty, xq), (xd_ty, xd), (xs_ty, xs))
                ]
            )
        # the weight row fixes n_in: activation buffers may be wider (shared scratch space)
        row_bytes = cgutils.unpack_tuple(builder, w_ary.shape, 1)[0]
        n_blocks = builder.udiv(row_bytes, _I64(self.block_bytes))
        zero = ir.Constant(_V8F, [0.0] * 8)
        accs = [
            [cgutils.alloca_once_value(builder, zero) for _ in range(self.n_acc)] for _ in tokens
        ]
        summs = [cgutils.alloca_once_value(builder, _F32(0.0)) for _ in tokens]
        step = _I64(self.n_acc)
        with cgutils.for_range(builder, builder.udiv(n_blocks, step)) as loop:
            for p in range(self.n_acc):
                i = builder.add(builder.mul(loop.index, step), _I64(p))
                self.block(builder, w_ptr, tokens, i, [a[p] for a in accs], summs)
        with builder.if_then(builder.icmp_unsigned("!=", builder.urem(n_blocks, step), _I64(0))):
            i = builder.sub(n_blocks, _I64(1))
            self.block(builder, w_ptr, tokens, i, [a[0] for a in accs], summs)
        results = []
        for acc, summ in zip(accs, summs):
            total = builder.load(acc[0])
            for other in acc[1:]:
                total = builder.fadd(total, builder.load(other))
            results.append(builder.fadd(_hsum8(builder, total), builder.load(summ)))
        return context.make_tuple(builder, sig.return_type, results)


def _is_2d(ty, dtype) -> bool:
    return isinstance(ty, types.Array) and ty.ndim == 2 and ty.layout == "C" and ty.dtype == dtype


def _rowdot_intrinsic(name: str, decode, block_bytes: int, has_min: bool, n_tok: int):
    """intrinsic rowdot(w_row u8[], xq i8[:, :], xd f32[:, :], xs f32[:, :], t0) ->
    n_tok-tuple of f32: dot(w_row, token t0 + k) for k < n_tok."""
    emitter = _RowDot(decode, block_bytes, has_min, n_tok)

    def typer(typingctx, w, xq, xd, xs, t0):
        ok = (
            isinstance(w, types.Array)
            and w.ndim == 1
            and w.layout == "C"
            and w.dtype == types.uint8
            and _is_2d(xq, types.int8)
            and _is_2d(xd, types.float32)
            and _is_2d(xs, types.float32)
        )
        ret = types.UniTuple(types.float32, n_tok)
        return (ret(w, xq, xd, xs, types.int64), emitter.emit) if ok else None

    typer.__name__ = typer.__qualname__ = f"rowdot{n_tok}_{name}"
    return intrinsic(typer)


TOKENS_PER_CALL = 4  # prefill: tokens per weight-block decode
PREFETCH_BYTES = 1024  # how far ahead of the current block to prefetch weights (any row)

# name, decoder, block bytes, has a minimum (the `_1` formats, Q8_1 activations)
_FORMATS = {
    "q8_0": (_decode_q8_0, 34, False),
    "q4_0": (_decode_q4_0, 18, False),
    "q4_1": (_decode_q4_1, 20, True),
    "q5_0": (_decode_q5_0, 22, False),
    "q5_1": (_decode_q5_1, 24, True),
}


def _rowdots(name: str):
    """The (1-token, TOKENS_PER_CALL-token) row-dot intrinsics of one format."""
    return tuple(_rowdot_intrinsic(name, *_FORMATS[name], n) for n in (1, TOKENS_PER_CALL))


_rowdot_q8_0, _rowdot4_q8_0 = _rowdots("q8_0")
_rowdot_q4_0, _rowdot4_q4_0 = _rowdots("q4_0")
_rowdot_q4_1, _rowdot4_q4_1 = _rowdots("q4_1")
_rowdot_q5_0, _rowdot4_q5_0 = _rowdots("q5_0")
_rowdot_q5_1, _rowdot4_q5_1 = _rowdots("q5_1")


# ---- kernels: one per type, identical loops around the type's row dot product
# (written out rather than made by a factory so that numba's cache=True can key each one)


@njit(parallel=True, cache=True)
def matmul_q8_0(w, xq, xd, xs, xf, out) -> None:
    n_tok, n_out = out.shape
    n_quad = n_tok // TOKENS_PER_CALL
    for c in prange((n_out + ROWS_PER_CHUNK - 1) // ROWS_PER_CHUNK):
        r_end = min(c * ROWS_PER_CHUNK + ROWS_PER_CHUNK, n_out)
        for tq in range(n_quad):
            for r in range(c * ROWS_PER_CHUNK, r_end):
                res = _rowdot4_q8_0(w[r], xq, xd, xs, tq * TOKENS_PER_CALL)
                for k in range(TOKENS_PER_CALL):
                    out[tq * TOKENS_PER_CALL + k, r] = res[k]
        for t in range(n_quad * TOKENS_PER_CALL, n_tok):
            for r in range(c * ROWS_PER_CHUNK, r_end):
                out[t, r] = _rowdot_q8_0(w[r], xq, xd, xs, t)[0]


@njit(parallel=True, cache=True)
def matmul_q4_0(w, xq, xd, xs, xf, out) -> None:
    n_tok, n_out = out.shape
    n_quad = n_tok // TOKENS_PER_CALL
    for c in prange((n_out + ROWS_PER_CHUNK - 1) // ROWS_PER_CHUNK):
        r_end = min(c * ROWS_PER_CHUNK + ROWS_PER_CHUNK, n_out)
        for tq in range(n_quad):
            for r in range(c * ROWS_PER_CHUNK, r_end):
                res = _rowdot4_q4_0(w[r], xq, xd, xs, tq * TOKENS_PER_CALL)
                for k in range(TOKENS_PER_CALL):
                    out[tq * TOKENS_PER_CALL + k, r] = res[k]
        for t in range(n_quad * TOKENS_PER_CALL, n_tok):
            for r in range(c * ROWS_PER_CHUNK, r_end):
                out[t, r] = _rowdot_q4_0(w[r], xq, xd, xs, t)[0]


@njit(parallel=True, cache=True)
def matmul_q4_1(w, xq, xd, xs, xf, out) -> None:
    n_tok, n_out = out.shape
    n_quad = n_tok // TOKENS_PER_CALL
    for c in prange((n_out + ROWS_PER_CHUNK - 1) // ROWS_PER_CHUNK):
        r_end = min(c * ROWS_PER_CHUNK + ROWS_PER_CHUNK, n_out)
        for tq in range(n_quad):
            for r in range(c * ROWS_PER_CHUNK, r_end):
                res = _rowdot4_q4_1(w[r], xq, xd, xs, tq * TOKENS_PER_CALL)
                for k in range(TOKENS_PER_CALL):
                    out[tq * TOKENS_PER_CALL + k, r] = res[k]
        for t in range(n_quad * TOKENS_PER_CALL, n_tok):
            for r in range(c * ROWS_PER_CHUNK, r_end):
                out[t, r] = _rowdot_q4_1(w[r], xq, xd, xs, t)[0]


@njit(parallel=True, cache=True)
def matmul_q5_0(w, xq, xd, xs, xf, out) -> None:
    n_tok, n_out = out.shape
    n_quad = n_tok // TOKENS_PER_CALL
    for c in prange((n_out + ROWS_PER_CHUNK - 1) // ROWS_PER_CHUNK):
        r_end = min(c * ROWS_PER_CHUNK + ROWS_PER_CHUNK, n_out)
        for tq in range(n_quad):
            for r in range(c * ROWS_PER_CHUNK, r_end):
                res = _rowdot4_q5_0(w[r], xq, xd, xs, tq * TOKENS_PER_CALL)
                for k in range(TOKENS_PER_CALL):
                    out[tq * TOKENS_PER_CALL + k, r] = res[k]
        for t in range(n_quad * TOKENS_PER_CALL, n_tok):
            for r in range(c * ROWS_PER_CHUNK, r_end):
                out[t, r] = _rowdot_q5_0(w[r], xq, xd, xs, t)[0]


@njit(parallel=True, cache=True)
def matmul_q5_1(w, xq, xd, xs, xf, out) -> None:
    n_tok, n_out = out.shape
    n_quad = n_tok // TOKENS_PER_CALL
    for c in prange((n_out + ROWS_PER_CHUNK - 1) // ROWS_PER_CHUNK):
        r_end = min(c * ROWS_PER_CHUNK + ROWS_PER_CHUNK, n_out)
        for tq in range(n_quad):
            for r in range(c * ROWS_PER_CHUNK, r_end):
                res = _rowdot4_q5_1(w[r], xq, xd, xs, tq * TOKENS_PER_CALL)
                for k in range(TOKENS_PER_CALL):
                    out[tq * TOKENS_PER_CALL + k, r] = res[k]
        for t in range(n_quad * TOKENS_PER_CALL, n_tok):
            for r in range(c * ROWS_PER_CHUNK, r_end):
                out[t, r] = _rowdot_q5_1(w[r], xq, xd, xs, t)[0]


# ---- float weights


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
            return _half_to_f32(builder, value)
        return builder.bitcast(builder.shl(builder.zext(value, _I32), _I32(16)), _F32)

    return types.float32(v), codegen


_FLOAT_MATH = {"reassoc", "contract"}  # lane-split sums and FMA, as ggml's SIMD dot products


@njit(parallel=True, cache=True, fastmath=_FLOAT_MATH)
def matmul_float(w, xq, xd, xs, xf, out) -> None:
    """F32 (float32 w) weights; F16 and BF16 come through matmul_f16 / matmul_bf16."""
    n_tok, n_out = out.shape
    n_in = w.shape[1]  # xf may be wider (shared scratch space)
    n_quad = n_tok // 4
    for c in prange((n_out + ROWS_PER_CHUNK - 1) // ROWS_PER_CHUNK):
        r_end = min(c * ROWS_PER_CHUNK + ROWS_PER_CHUNK, n_out)
        for t in range(0, n_quad * 4, 4):  # 4 tokens per converted weight (prefill)
            for r in range(c * ROWS_PER_CHUNK, r_end):
                a0 = a1 = a2 = a3 = np.float32(0.0)
                for i in range(n_in):
                    v = _weight_to_f32(w[r, i])
                    a0 += v * xf[t, i]
                    a1 += v * xf[t + 1, i]
                    a2 += v * xf[t + 2, i]
                    a3 += v * xf[t + 3, i]
                out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = a0, a1, a2, a3
        for t in range(n_quad * 4, n_tok):
            for r in range(c * ROWS_PER_CHUNK, r_end):
                acc = np.float32(0.0)
                for i in range(n_in):
                    acc += _weight_to_f32(w[r, i]) * xf[t, i]
                out[t, r] = acc


def matmul_f16(w, xq, xd, xs, xf, out) -> None:
    """F16 weights (float16, or their bits as uint16 / raw uint8 bytes) times F16-rounded
    activations, f32 accumulation."""
    matmul_float(w.view(np.int16), xq, xd, xs, xf, out)


def matmul_bf16(w, xq, xd, xs, xf, out) -> None:
    """BF16 weights (uint16 bits, or the raw uint8 bytes GGUFReader hands out) times
    BF16-rounded activations, f32 accumulation."""
    matmul_float(w.view(np.uint16), xq, xd, xs, xf, out)


register(T.F32, F32_ACT, matmul_float)
register(T.F16, F16_ACT, matmul_f16)
register(T.BF16, BF16_ACT, matmul_bf16)
register(T.Q8_0, Q8_0_ACT, matmul_q8_0)
register(T.Q4_0, Q8_0_ACT, matmul_q4_0)
register(T.Q4_1, Q8_1_ACT, matmul_q4_1)
register(T.Q5_0, Q8_0_ACT, matmul_q5_0)
register(T.Q5_1, Q8_1_ACT, matmul_q5_1)
