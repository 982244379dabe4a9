"""Matrix products for the k-quant weight types (Q2_K ... Q6_K) on Q8_K activations.

Numerics follow llama.cpp's CPU path (ggml-cpu/arch/x86/quants.c: ggml_vec_dot_qN_K_q8_K):
activations are quantized per 256 values to int8 with one f32 scale and 16 group sums
("bsums"); each 256-value super-block of weights gives an exact int32 dot product, which is
scaled by d_w * d_x and summed in f32. Every format is written as
`unsigned small weight u  x  signed activation`, plus a per-group correction that only needs
the bsums:

    Q4_K, Q5_K, Q2_K   w = d*sc*u - dmin*m       ->  d*sum(sc*u.x) - dmin*sum(m*bsum)
    Q6_K               w = d*sc*(u - 32)         ->  d*(sum(sc*u.x) - 32*sum(sc*bsum))
    Q3_K               w = d*sc*(u - 4)          ->  d*(sum(sc*u.x) -  4*sum(sc*bsum))

Speed: the loop vectorizer cannot be trusted with nibble and bit-field code (see
docs/kernels.md), so a whole row's dot product is one Numba intrinsic that emits LLVM vector
IR, like llama.cpp's AVX2 code: per 32 weights, load 32 bytes, mask/shift the bit fields, u8 x
s8 pair products (`maddubs`), times the group scales by an i16 x i16 pair product (`madd`),
int32 x 8 accumulation; per super-block, one f32 x 8 multiply-add; per row, one horizontal
sum. With VNNI the scale product and the add fuse into `vpdpwssd`, and with AVX-512 two chunks
share a zmm register. Each weight block is unpacked once for TILE tokens (prefill, batches)
and prefetched ahead. Numba only runs the loops over rows and tokens; products under
SERIAL_WORK run on the calling thread (no fork/join).

Arrays handed to the kernels must be C-contiguous (a memory-mapped GGUF tensor is).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType
from llvmlite import ir
from numba import literally, njit, prange, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from edgeinfer.kernels.f16 import half_to_f32
from edgeinfer.kernels.ops import parallel_rows
from edgeinfer.kernels.registry import ActFormat, register
from edgeinfer.kernels.schedule import chunk_counters, n_workers, next_chunk
from edgeinfer.kernels.target import CPU_FEATURES

QK_K = 256

# ---------------------------------------------------------------------------------------------
# Target choice, made once here. On x86 with AVX2 the two pair-product steps call LLVM's x86
# intrinsics (vpmaddubsw, vpmaddwd): LLVM does not pattern-match u8 x s8 -> i16 pair sums from
# portable IR (checked with LLVM 20), and that instruction is what llama.cpp's kernels are
# built on. Elsewhere (ARM, old x86) the same kernels use portable IR that LLVM lowers to
# whatever the target has. Numba's cache key includes the target CPU and features.
# ---------------------------------------------------------------------------------------------


USE_X86_AVX2 = "avx2" in CPU_FEATURES
# vpdpwssd (AVX512-VNNI on 256-bit registers, or AVX-VNNI): i16 pair products added into i32
USE_X86_VNNI = USE_X86_AVX2 and ("avxvnni" in CPU_FEATURES
                                 or {"avx512vnni", "avx512vl"} <= CPU_FEATURES)
# 512-bit registers (AVX512BW + VNNI): two 32-value chunks per vpmaddubsw / vpdpwssd
USE_X86_VNNI_512 = USE_X86_VNNI and {"avx512bw", "avx512vnni"} <= CPU_FEATURES

# ---------------------------------------------------------------------------------------------
# LLVM IR building blocks
# ---------------------------------------------------------------------------------------------

_i8, _i16, _i32, _f32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_i8p = _i8.as_pointer()


def _vec(elt: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(elt, n)


def _splat_const(elt: ir.Type, n: int, value: int) -> ir.Constant:
    return ir.Constant(_vec(elt, n), [value] * n)


def _shuffle(b: ir.IRBuilder, v: ir.Value, lanes: list[int]) -> ir.Value:
    mask = ir.Constant(_vec(_i32, len(lanes)), lanes)
    return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), mask)


def _load(b: ir.IRBuilder, base: ir.Value, offset: int, elt: ir.Type, n: int) -> ir.Value:
    """Unaligned load of an <n x elt> vector (or a scalar when n == 0) at base + offset bytes."""
    ty = elt if n == 0 else _vec(elt, n)
    ptr = b.bitcast(b.gep(base, [ir.Constant(_i32, offset)]), ty.as_pointer())
    return b.load(ptr, align=1)


def _load_f16(b: ir.IRBuilder, base: ir.Value, offset: int) -> ir.Value:
    return half_to_f32(b, _load(b, base, offset, _i16, 0))


def _call(b: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return b.call(cgutils.get_or_insert_function(b.module, fnty, name), args)


def _bits(b: ir.IRBuilder, v: ir.Value, shift: int, mask: int) -> ir.Value:
    """(v >> shift) & mask on a byte vector."""
    n = v.type.count
    if shift:
        v = b.lshr(v, _splat_const(_i8, n, shift))
    return b.and_(v, _splat_const(_i8, n, mask))


def _maddubs(b: ir.IRBuilder, u: ir.Value, x: ir.Value) -> ir.Value:
    """<32 x u8> * <32 x s8> -> <16 x i16> sums of adjacent products. Callers keep u <= 63,
    so the sums (<= 2*63*127) never reach vpmaddubsw's saturation and both paths agree."""
    if USE_X86_AVX2:
        return _call(b, "llvm.x86.avx2.pmadd.ub.sw", _vec(_i16, 16), [u, x])
    p = b.mul(b.zext(u, _vec(_i16, 32)), b.sext(x, _vec(_i16, 32)))
    return b.add(_shuffle(b, p, list(range(0, 32, 2))), _shuffle(b, p, list(range(1, 32, 2))))


def _madd(b: ir.IRBuilder, p: ir.Value, s: ir.Value) -> ir.Value:
    """<16 x i16> * <16 x i16> -> <8 x i32> sums of adjacent products (vpmaddwd)."""
    if USE_X86_AVX2:
        return _call(b, "llvm.x86.avx2.pmadd.wd", _vec(_i32, 8), [p, s])
    q = b.mul(b.sext(p, _vec(_i32, 16)), b.sext(s, _vec(_i32, 16)))
    return b.add(_shuffle(b, q, list(range(0, 16, 2))), _shuffle(b, q, list(range(1, 16, 2))))


def _scaled_dot(
    b: ir.IRBuilder, u: ir.Value, xp: ir.Value, xoff: int, scales: ir.Value, acc
) -> ir.Value:
    """acc + sum over 32 values of scale * u * x, as <8 x i32>; scales is <16 x i16> (one per
    pair). With VNNI the pair product and the add are one vpdpwssd."""
    pairs = _maddubs(b, u, _load(b, xp, xoff, _i8, 32))
    if USE_X86_VNNI and acc is not None:
        v8 = _vec(_i32, 8)
        name = "llvm.x86.avx512.vpdpwssd.256"
        return _call(b, name, v8, [acc, b.bitcast(pairs, v8), b.bitcast(scales, v8)])
    part = _madd(b, pairs, scales)
    return part if acc is None else b.add(acc, part)


def _scales16_per_16(b: ir.IRBuilder, sc16: ir.Value, k: int) -> ir.Value:
    """Scale vector for chunk k of 32 values grouped by 16: pairs 0-7 use group 2k, 8-15 2k+1."""
    return _shuffle(b, sc16, [2 * k] * 8 + [2 * k + 1] * 8)


def _bsum_dot(b: ir.IRBuilder, sp: ir.Value, coef: ir.Value) -> ir.Value:
    """coef[g] * bsum[g] over the 16 groups of 16, summed in pairs to <8 x i32>: one
    vpmaddwd. The bsums are int32 (|bsum| <= 16 * 127, so their low halves are exact i16);
    coef is <16 x i16>: a scale per group, or a sub-block's value twice."""
    bsums = b.trunc(_load(b, sp, 0, _i32, 16), _vec(_i16, 16))
    return _madd(b, bsums, coef)


def _splat(b: ir.IRBuilder, v: ir.Value, n: int) -> ir.Value:
    one = b.insert_element(ir.Constant(_vec(v.type, 1), ir.Undefined), v, ir.Constant(_i32, 0))
    return _shuffle(b, one, [0] * n)


def _scale_f32x8(b: ir.IRBuilder, isum: ir.Value, scale: ir.Value) -> ir.Value:
    """<8 x i32> -> <8 x f32> times a scalar f32."""
    return b.fmul(b.sitofp(isum, _vec(_f32, 8)), _splat(b, scale, 8))


def _hsum_f32(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """Tree sum of an <8 x f32>, once per row and token."""
    while v.type.count > 1:
        half = v.type.count // 2
        v = b.fadd(_shuffle(b, v, list(range(half))), _shuffle(b, v, list(range(half, 2 * half))))
    return b.extract_element(v, ir.Constant(_i32, 0))


def _shuffle2(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """Concatenation of two vectors of the same type."""
    n = lo.type.count
    return b.shuffle_vector(lo, hi, ir.Constant(_vec(_i32, 2 * n), list(range(2 * n))))


def _i32_vector(b: ir.IRBuilder, words: list[ir.Value]) -> ir.Value:
    v = ir.Constant(_vec(_i32, len(words)), ir.Undefined)
    for i, word in enumerate(words):
        v = b.insert_element(v, word, ir.Constant(_i32, i))
    return v


# ---------------------------------------------------------------------------------------------
# One super-block per format: unpack(b, wp) -> Unpacked. wp points at the weight block.
# chunks[k] = (u, scales) for values 32k..32k+31: u <32 x u8> unsigned weights, scales the
# <16 x i16> scale of each pair; finish(b, acc, sp, dx) turns the <8 x i32> sum of
# scale*u*x into the block's contribution as <8 x f32> lanes (summed once per row, as
# llama.cpp does), using the 16 f32 bsums at sp and the activation scale dx.
# Byte layouts: gguf-py quants.py (and ggml-common.h block_qN_K).
# ---------------------------------------------------------------------------------------------


class Unpacked(NamedTuple):
    chunks: list[tuple[ir.Value, ir.Value]]
    finish: Callable[[ir.IRBuilder, ir.Value, ir.Value, ir.Value], ir.Value]


def _k4_scales_mins(b: ir.IRBuilder, wp: ir.Value, offset: int) -> ir.Value:
    """Q4_K/Q5_K 12-byte 6-bit scales -> <16 x i8>: 8 scales then 8 mins. llama.cpp's kmask
    unpacking on the three little-endian words u0, u1, u2, done on one 4-word vector (the
    16-byte load reads 4 bytes of the quants that follow, unused):
    [u0 & k1, u2 & k2 | (u0 >> 6 & k3) << 4, u1 & k1, u2 >> 4 & k2 | (u1 >> 6 & k3) << 4]."""
    u = _load(b, wp, offset, _i32, 4)  # u0, u1, u2, (quants)
    k1, k2, k3 = 0x3F3F3F3F, 0x0F0F0F0F, 0x03030303

    def words(*values):
        return ir.Constant(_vec(_i32, 4), list(values))

    low = b.and_(b.lshr(_shuffle(b, u, [0, 2, 1, 2]), words(0, 0, 0, 4)), words(k1, k2, k1, k2))
    top = b.and_(b.lshr(_shuffle(b, u, [0, 0, 1, 1]), words(6, 6, 6, 6)), words(0, k3, 0, k3))
    return b.bitcast(b.or_(low, b.shl(top, words(4, 4, 4, 4))), _vec(_i8, 16))


def _nibble_chunks(b: ir.IRBuilder, wp: ir.Value, offset: int) -> tuple[ir.Value, ir.Value]:
    """32 bytes of packed quants -> (low nibbles, high nibbles), each <32 x u8>. Built as one
    64-byte vector (the bytes twice, the upper copy shifted right by 4 in 16-bit lanes, then
    masked), which the 512-bit path pairs back whole: a broadcast, a variable shift and an
    and, instead of two masks, a shift and a lane insert."""
    q = _load(b, wp, offset, _i8, 32)
    both = b.bitcast(_shuffle(b, q, list(range(32)) * 2), _vec(_i16, 32))
    both = b.lshr(both, ir.Constant(_vec(_i16, 32), [0] * 16 + [4] * 16))
    v = b.and_(b.bitcast(both, _vec(_i8, 64)), _splat_const(_i8, 64, 0x0F))
    return _shuffle(b, v, list(range(32))), _shuffle(b, v, list(range(32, 64)))


def _with_mins(wp: ir.Value, d_off: int, dmin_off: int, mins: ir.Value):
    """finish() for w = d*sc*u - dmin*m: dx*d * sum(sc*u.x) - dx*dmin * sum(m*bsum); mins
    is <16 x i16>, one per group of 16."""

    def finish(b, acc, sp, dx):
        d, dmin = _load_f16(b, wp, d_off), _load_f16(b, wp, dmin_off)
        imin = _bsum_dot(b, sp, mins)
        main = _scale_f32x8(b, acc, b.fmul(dx, d))
        return b.fsub(main, _scale_f32x8(b, imin, b.fmul(dx, dmin)))

    return finish


def _with_offset(wp: ir.Value, d_off: int, sc16: ir.Value, offset_log2: int):
    """finish() for w = d*sc*(u - 2^k): dx*d * (sum(sc*u.x) - 2^k * sum(sc*bsum)); sc16 is
    <16 x i16>."""

    def finish(b, acc, sp, dx):
        corr = _bsum_dot(b, sp, sc16)
        isum = b.sub(acc, b.shl(corr, _splat_const(_i32, 8, offset_log2)))
        return _scale_f32x8(b, isum, b.fmul(dx, _load_f16(b, wp, d_off)))

    return finish


def _unpack_q4_k(b: ir.IRBuilder, wp: ir.Value) -> Unpacked:
    # d f16 | dmin f16 | scales[12] | qs[128]; per 32 bytes, low nibbles are sub-block 2c and
    # high nibbles sub-block 2c+1.
    scales_mins = _k4_scales_mins(b, wp, 4)
    sc16 = b.zext(scales_mins, _vec(_i16, 16))
    chunks = []
    for j in range(0, 8, 2):
        u_lo, u_hi = _nibble_chunks(b, wp, 16 + 16 * j)
        chunks += [(u_lo, _shuffle(b, sc16, [j] * 16)), (u_hi, _shuffle(b, sc16, [j + 1] * 16))]
    mins = b.zext(_shuffle(b, scales_mins, [8 + j // 2 for j in range(16)]), _vec(_i16, 16))
    return Unpacked(chunks, _with_mins(wp, 0, 2, mins))


def _unpack_q5_k(b: ir.IRBuilder, wp: ir.Value) -> Unpacked:
    # d f16 | dmin f16 | scales[12] | qh[32] | qs[128]; as Q4_K, plus bit j of qh[l] as the
    # fifth bit of value l of sub-block j.
    scales_mins = _k4_scales_mins(b, wp, 4)
    sc16 = b.zext(scales_mins, _vec(_i16, 16))
    qh = _load(b, wp, 16, _i8, 32)
    chunks = []
    for j in range(0, 8, 2):
        for k, low in enumerate(_nibble_chunks(b, wp, 48 + 16 * j)):
            high = b.shl(_bits(b, qh, j + k, 1), _splat_const(_i8, 32, 4))
            chunks.append((b.or_(low, high), _shuffle(b, sc16, [j + k] * 16)))
    mins = b.zext(_shuffle(b, scales_mins, [8 + j // 2 for j in range(16)]), _vec(_i16, 16))
    return Unpacked(chunks, _with_mins(wp, 0, 2, mins))


def _unpack_q6_k(b: ir.IRBuilder, wp: ir.Value) -> Unpacked:
    # ql[128] | qh[64] | scales[16] i8 | d f16. Chunk k (half h = k//4, s = k%4): low 4 bits
    # from ql[64h + 32(s%2) + l] >> 4(s//2), high 2 bits from qh[32h + l] >> 2s; value u - 32.
    sc8 = _load(b, wp, 192, _i8, 16)
    sc16 = b.sext(sc8, _vec(_i16, 16))
    chunks = []
    for k in range(8):
        h, s = divmod(k, 4)
        low = _bits(b, _load(b, wp, 64 * h + 32 * (s % 2), _i8, 32), 4 * (s // 2), 0x0F)
        high = _bits(b, _load(b, wp, 128 + 32 * h, _i8, 32), 2 * s, 0x03)
        u = b.or_(low, b.shl(high, _splat_const(_i8, 32, 4)))
        chunks.append((u, _scales16_per_16(b, sc16, k)))
    return Unpacked(chunks, _with_offset(wp, 208, sc16, 5))


def _q3_k_scales(b: ir.IRBuilder, wp: ir.Value, offset: int) -> ir.Value:
    """Q3_K 12-byte 6-bit scales -> <16 x i8> signed (value - 32), llama.cpp's kmask unpacking:
    low 4 bits from bytes 0-7 (low then high nibbles), high 2 bits from bytes 8-11."""
    u0, u1, u2 = (_load(b, wp, offset + 4 * i, _i32, 0) for i in range(3))
    k1, k2 = ir.Constant(_i32, 0x03030303), ir.Constant(_i32, 0x0F0F0F0F)

    def sh(v, n):
        return b.lshr(v, ir.Constant(_i32, n)) if n else v

    def word(low, hshift):
        return b.or_(b.and_(low, k2), b.shl(b.and_(sh(u2, hshift), k1), ir.Constant(_i32, 4)))

    words = [word(u0, 0), word(u1, 2), word(sh(u0, 4), 4), word(sh(u1, 4), 6)]
    sc = b.bitcast(_i32_vector(b, words), _vec(_i8, 16))
    return b.sub(sc, _splat_const(_i8, 16, 32))


def _unpack_q3_k(b: ir.IRBuilder, wp: ir.Value) -> Unpacked:
    # hmask[32] | qs[64] | scales[12] | d f16. Chunk k (h = k//4, s = k%4): 2 low bits from
    # qs[32h + l] >> 2s, third bit = bit k of hmask[l]; value u - 4.
    sc8 = _q3_k_scales(b, wp, 96)
    sc16 = b.sext(sc8, _vec(_i16, 16))
    hmask = _load(b, wp, 0, _i8, 32)
    chunks = []
    for k in range(8):
        h, s = divmod(k, 4)
        low = _bits(b, _load(b, wp, 32 + 32 * h, _i8, 32), 2 * s, 0x03)
        u = b.or_(low, b.shl(_bits(b, hmask, k, 1), _splat_const(_i8, 32, 2)))
        chunks.append((u, _scales16_per_16(b, sc16, k)))
    return Unpacked(chunks, _with_offset(wp, 108, sc16, 2))


def _unpack_q2_k(b: ir.IRBuilder, wp: ir.Value) -> Unpacked:
    # scales[16] (low nibble scale, high nibble min) | qs[64] | d f16 | dmin f16.
    # Chunk k (h = k//4, s = k%4): value = qs[32h + l] >> 2s & 3.
    packed = _load(b, wp, 0, _i8, 16)
    sc16 = b.zext(_bits(b, packed, 0, 0x0F), _vec(_i16, 16))
    chunks = []
    for k in range(8):
        h, s = divmod(k, 4)
        u = _bits(b, _load(b, wp, 16 + 32 * h, _i8, 32), 2 * s, 0x03)
        chunks.append((u, _scales16_per_16(b, sc16, k)))
    mins = b.zext(_bits(b, packed, 4, 0x0F), _vec(_i16, 16))
    return Unpacked(chunks, _with_mins(wp, 80, 82, mins))


# ---------------------------------------------------------------------------------------------
# Numba glue: one intrinsic computes a whole row against TILE tokens, looping over the
# super-blocks in IR so the f32 accumulators stay <8 x f32> registers until the end of the row.
# The weights are unpacked once per block for all TILE tokens.
# ---------------------------------------------------------------------------------------------

# Weights are read once, in order, but the hardware prefetcher alone left Q4_K decode at
# 3.5 GB/s once the matrix outgrew the last-level cache (9.6 GB/s while it fit). Asking for
# the bytes PREFETCH_BYTES ahead (about a row) restores the in-cache speed.
PREFETCH_BYTES = 2048
TILE = 8  # tokens per weight-block unpack (prefill, batches)
ROWS_PER_CHUNK = 8  # rows per chunk

# qtype -> (unpack, block bytes), filled by _make_matmul.
_UNPACKERS: dict[int, tuple[Callable[[ir.IRBuilder, ir.Value], Unpacked], int]] = {}


def _prefetch(b: ir.IRBuilder, wp: ir.Value, block_bytes: int) -> None:
    for line in range(0, block_bytes, 64):
        ptr = b.gep(wp, [ir.Constant(_i32, PREFETCH_BYTES + line)])
        read, keep, data = (ir.Constant(_i32, v) for v in (0, 3, 1))
        _call(b, "llvm.prefetch.p0", ir.VoidType(), [ptr, read, keep, data])


class _Rows:
    """Byte pointers into the rows of a C-contiguous 2-D array argument of an intrinsic."""

    def __init__(self, context, builder: ir.IRBuilder, aryty, value):
        a = context.make_array(aryty)(context, builder, value)
        self.b = builder
        self.data = builder.bitcast(a.data, _i8p)
        self.n_cols = cgutils.unpack_tuple(builder, a.shape, 2)[1]
        self.stride = cgutils.unpack_tuple(builder, a.strides, 2)[0]

    def block(self, row: ir.Value, blk: ir.Value, block_bytes: int) -> ir.Value:
        """i8* to the blk-th block of `block_bytes` bytes in row `row`."""
        b = self.b
        offset = b.add(b.mul(row, self.stride), b.mul(blk, ir.Constant(blk.type, block_bytes)))
        return b.gep(self.data, [offset])


def _literal_int(ty) -> int:
    if not isinstance(ty, types.IntegerLiteral):
        raise TypingError("_row_dot needs compile-time constant qtype and tile")
    return ty.literal_value


def _accumulate_block(b, unpacked: Unpacked, xq: _Rows, xd: _Rows, xs: _Rows, toks, blk, accs):
    """accs[t] (<8 x f32>* ) += this weight block against token toks[t]'s block blk."""
    for tok, acc_ptr in zip(toks, accs):
        xp, sp = xq.block(tok, blk, QK_K), xs.block(tok, blk, 64)
        dx = b.load(b.bitcast(xd.block(tok, blk, 4), _f32.as_pointer()))
        isum = None
        if USE_X86_VNNI_512:  # two chunks per zmm instruction, then the halves added
            for k in range(0, len(unpacked.chunks), 2):
                (u0, s0), (u1, s1) = unpacked.chunks[k : k + 2]
                u = _shuffle2(b, u0, u1)
                x = _load(b, xp, 32 * k, _i8, 64)
                pairs = _call(b, "llvm.x86.avx512.pmaddubs.w.512", _vec(_i16, 32), [u, x])
                v16 = _vec(_i32, 16)
                acc = ir.Constant(v16, [0] * 16) if isum is None else isum
                scales = b.bitcast(_shuffle2(b, s0, s1), v16)
                isum = _call(
                    b, "llvm.x86.avx512.vpdpwssd.512", v16, [acc, b.bitcast(pairs, v16), scales]
                )
            isum = b.add(_shuffle(b, isum, list(range(8))), _shuffle(b, isum, list(range(8, 16))))
        else:
            for k, (u, scales) in enumerate(unpacked.chunks):
                isum = _scaled_dot(b, u, xp, 32 * k, scales, isum)
        b.store(b.fadd(b.load(acc_ptr), unpacked.finish(b, isum, sp, dx)), acc_ptr)


@intrinsic
def _row_dot(typingctx, qtype, tile, w, row, xq, xd, xs, tok):
    """(qtype, tile, w, row, xq, xd, xs, tok) -> UniTuple(f32, tile): weight row `row` dotted
    with tokens tok..tok+tile-1. qtype and tile must be compile-time constants."""
    unpack, block_bytes = _UNPACKERS[_literal_int(qtype)]
    n_tile = _literal_int(tile)
    for arr in (w, xq, xd, xs):
        if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout == "C"):
            raise TypingError("k-quant kernels need C-contiguous 2-D arrays")
    ret = types.UniTuple(types.float32, n_tile)
    sig = ret(qtype, tile, w, types.intp, xq, xd, xs, types.intp)

    def codegen(context, builder, sig, args):
        row, tok = args[3], args[7]
        w, xq, xd, xs = (_Rows(context, builder, sig.args[i], args[i]) for i in (2, 4, 5, 6))
        toks = [builder.add(tok, ir.Constant(tok.type, t)) for t in range(n_tile)]
        zero = ir.Constant(_vec(_f32, 8), [0.0] * 8)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(n_tile)]
        # the weight row fixes n_in: activation buffers may be wider (shared scratch space)
        n_blk = builder.udiv(w.n_cols, ir.Constant(tok.type, block_bytes))
        with cgutils.for_range(builder, n_blk) as loop:
            wp = w.block(row, loop.index, block_bytes)
            _prefetch(builder, wp, block_bytes)
            unpacked = unpack(builder, wp)  # once for all the tile's tokens
            _accumulate_block(builder, unpacked, xq, xd, xs, toks, loop.index, accs)
        values = [_hsum_f32(builder, builder.load(acc_ptr)) for acc_ptr in accs]
        return context.make_tuple(builder, ret, values)

    return sig, codegen


# ---------------------------------------------------------------------------------------------
# Kernels: kernel(w, xq, xd, xs, xf, out), see registry.py. Chunks of weight rows shared out
# between the threads (schedule.py); a row stays in L1 while every token is dotted with it, so
# prefill reads the weights once.
# ---------------------------------------------------------------------------------------------


# Below this many weight bytes x tokens a product runs on one thread: the second thread's
# fork/join costs a few us, more than it saves on a small matrix.
SERIAL_WORK = 64 * 1024


@njit(cache=True, nogil=True)
def _rows_tokens(code, tile, w, xq, xd, xs, out, r0, r1) -> None:
    """Rows [r0, r1) x all tokens, `tile` tokens per weight-block unpack; a last partial
    tile moves back to overlap the previous one (recomputing identical outputs)."""
    literally(code)
    literally(tile)
    n_tok = out.shape[0]
    for tok in range(0, n_tok, tile):
        tok = min(tok, n_tok - tile)
        for row in range(r0, r1):
            p = _row_dot(code, tile, w, row, xq, xd, xs, tok)
            for k in range(tile):
                out[tok + k, row] = p[k]


@njit(cache=True, nogil=True)
def _rows(code, w, xq, xd, xs, out, r0, r1) -> None:
    literally(code)
    n_tok = out.shape[0]
    if n_tok >= TILE:
        _rows_tokens(code, TILE, w, xq, xd, xs, out, r0, r1)
    elif n_tok >= 4:
        _rows_tokens(code, 4, w, xq, xd, xs, out, r0, r1)
    else:  # decode, and batches of 2-3
        _rows_tokens(code, 1, w, xq, xd, xs, out, r0, r1)


def _make_matmul(qtype: GGMLQuantizationType, unpack, block_bytes: int):
    """The kernel for one type. Its closure holds only the int `code`: Numba's on-disk cache
    key pickles closure cells, and a pickled intrinsic differs between processes."""
    _UNPACKERS[int(qtype)] = (unpack, block_bytes)
    code = int(qtype)

    def matmul(w, xq, xd, xs, xf, out) -> None:  # xf unused: uniform kernel signature
        n_out = w.shape[0]
        n_chunks = (n_out + ROWS_PER_CHUNK - 1) // ROWS_PER_CHUNK
        if w.shape[1] * n_out * out.shape[0] < SERIAL_WORK:  # no fork/join when small
            _rows(code, w, xq, xd, xs, out, np.int64(0), np.int64(n_out))
        else:  # each thread its own rows, then helps the others (schedule.py)
            counters, n_seg = chunk_counters(), n_workers(n_chunks)
            for task in prange(n_seg):
                c, k = next_chunk(counters, np.int64(task), np.int64(0), n_chunks, n_seg)
                while c >= 0:
                    r0 = c * ROWS_PER_CHUNK  # int64 everywhere: one compiled _rows
                    _rows(code, w, xq, xd, xs, out, r0, min(r0 + ROWS_PER_CHUNK, np.int64(n_out)))
                    c, k = next_chunk(counters, np.int64(task), k, n_chunks, n_seg)

    matmul.__name__ = matmul.__qualname__ = f"matmul_{qtype.name.lower()}"
    return njit(parallel=True, cache=True, nogil=True)(matmul)


matmul_q2_k = _make_matmul(GGMLQuantizationType.Q2_K, _unpack_q2_k, 84)
matmul_q3_k = _make_matmul(GGMLQuantizationType.Q3_K, _unpack_q3_k, 110)
matmul_q4_k = _make_matmul(GGMLQuantizationType.Q4_K, _unpack_q4_k, 144)
matmul_q5_k = _make_matmul(GGMLQuantizationType.Q5_K, _unpack_q5_k, 176)
matmul_q6_k = _make_matmul(GGMLQuantizationType.Q6_K, _unpack_q6_k, 210)


# ---------------------------------------------------------------------------------------------
# Q8_K activations: ggml-quants.c quantize_row_q8_K_ref, value for value.
# ---------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _quantize_row_q8_k(x, xq, xd, xs, tok) -> None:
    """One token's row: per 256 values, max = the signed value of largest magnitude (first
    one on ties), iscale = -127/max, q = min(127, nearest_int(iscale*x)) with ties to even,
    d = 1/iscale, bsums = sums of q per 16. An all-zero block gives d = 0, q = 0, bsums = 0.
    The max is found in two vectorizable passes (largest magnitude, then its first index),
    which picks the same value as ggml's one sequential pass."""
    for blk in range(x.shape[1] // QK_K):
        base = blk * QK_K
        row = x[tok, base : base + QK_K]
        m0 = m1 = m2 = m3 = np.float32(0.0)
        for j in range(0, QK_K, 4):
            m0 = max(m0, abs(row[j]))
            m1 = max(m1, abs(row[j + 1]))
            m2 = max(m2, abs(row[j + 2]))
            m3 = max(m3, abs(row[j + 3]))
        amax = max(max(m0, m1), max(m2, m3))
        if amax == 0:
            xd[tok, blk] = 0.0
            xq[tok, base : base + QK_K] = 0
            xs[tok, blk * 16 : blk * 16 + 16] = 0
            continue
        j = 0
        while abs(row[j]) != amax:
            j += 1
        iscale = np.float32(-127.0) / row[j]
        for g in range(16):
            gsum = 0
            for k in range(base + 16 * g, base + 16 * g + 16):
                # np.rint rounds ties to even, like nearest_int's 1.5*2^23 trick.
                q = min(127, int(np.rint(iscale * x[tok, k])))
                xq[tok, k] = q
                gsum += q
            xs[tok, blk * 16 + g] = gsum
        xd[tok, blk] = np.float32(1.0) / iscale


Q8_K_PARALLEL_VALUES = 4096  # ops.parallel_rows


@njit(cache=True, nogil=True)
def _quantize_q8_k_serial(x, xq, xd, xs) -> None:
    bsums = xs.view(np.int32)
    for tok in range(x.shape[0]):
        _quantize_row_q8_k(x, xq, xd, bsums, tok)


@njit(cache=True, nogil=True, parallel=True)
def _quantize_q8_k_parallel(x, xq, xd, xs) -> None:
    bsums = xs.view(np.int32)
    for tok in prange(x.shape[0]):
        _quantize_row_q8_k(x, xq, xd, bsums, tok)


@njit(cache=True, nogil=True)
def quantize_q8_k(x, xq, xd, xs, xf) -> None:  # xf unused
    """ggml's quantize_row_q8_K_ref for each token, the bsums as int32 in xs's bits (the
    kernels read them as integers); prefill batches split tokens across
    threads (2.8 ms per 512 x 2048 serially: 7% of a gemma-3 prefill), and so do decode
    batches from Q8_K_PARALLEL_VALUES values (8 x 640: 7.8 -> 6.3 us, 8 x 2048 29 -> 19,
    one Zen 4 core against two; 4 x 640 4.4 -> 5.6)."""
    if parallel_rows(x.shape[0], x.size, Q8_K_PARALLEL_VALUES):
        _quantize_q8_k_parallel(x, xq, xd, xs)
    else:
        _quantize_q8_k_serial(x, xq, xd, xs)


Q8_K_ACT = ActFormat("q8_k", QK_K, 16, quantize_q8_k)

register(GGMLQuantizationType.Q2_K, Q8_K_ACT, matmul_q2_k)
register(GGMLQuantizationType.Q3_K, Q8_K_ACT, matmul_q3_k)
register(GGMLQuantizationType.Q4_K, Q8_K_ACT, matmul_q4_k)
register(GGMLQuantizationType.Q5_K, Q8_K_ACT, matmul_q5_k)
register(GGMLQuantizationType.Q6_K, Q8_K_ACT, matmul_q6_k)
