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

Speed: the loop vectorizer cannot be trusted with nibble and bit-field code, so a whole row's
dot product is one Numba intrinsic that emits LLVM vector IR, like llama.cpp's AVX2 code: per
32 weights, load 32 bytes, mask/shift the bit fields, u8 x s8 pair products (`maddubs`), times
the group scales by an i16 x i16 pair product (`madd`), int32 x 8 accumulation; per
super-block, one f32 x 8 multiply-add; per row, one horizontal sum. With VNNI the scale product
and the add fuse into `vpdpwssd`, and with AVX-512 two chunks share a zmm register. Each weight
block is unpacked once for TILE tokens (prefill, batches) and prefetched ahead. Numba only runs
the loops over rows and tokens; products under SERIAL_WORK run on the calling thread (no
fork/join).

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

from edgeinfer.kernels.ir import (
    Array2D,
    from_scalars,
    load,
    load_f16,
    permute,
    prefetch,
    splat,
    splat_value,
    tree_sum,
    vec,
)
from edgeinfer.kernels.isa import ISA
from edgeinfer.kernels.ops import parallel_rows
from edgeinfer.kernels.registry import ActFormat, register
from edgeinfer.kernels.schedule import chunk_counters, n_workers, next_chunk

QK_K = 256

_i8, _i16, _i32, _f32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_i8p = _i8.as_pointer()

# ---------------------------------------------------------------------------------------------
# LLVM IR building blocks (the shared ones are in ir.py, the integer products in isa/)
# ---------------------------------------------------------------------------------------------


def _bits(b: ir.IRBuilder, v: ir.Value, shift: int, mask: int) -> ir.Value:
    """(v >> shift) & mask on a byte vector."""
    n = v.type.count
    if shift:
        v = b.lshr(v, splat(_i8, n, shift))
    return b.and_(v, splat(_i8, n, mask))


def _scaled_dot(
    b: ir.IRBuilder, u: ir.Value, xp: ir.Value, xoff: int, scales: ir.Value, acc
) -> ir.Value:
    """acc + sum over 32 values of scale * u * x, as <8 x i32>; scales is <16 x i16> (one per
    pair); acc None: the sum alone."""
    x = load(b, xp, xoff, vec(_i8, 32))
    if ISA.scaled_dot is not None:
        return ISA.scaled_dot(b, acc, u, x, scales)
    return ISA.i16_pairs_add(b, acc, ISA.u8s8_pairs(b, u, x), scales)


def _scales16_per_16(b: ir.IRBuilder, sc16: ir.Value, k: int) -> ir.Value:
    """Scale vector for chunk k of 32 values grouped by 16: pairs 0-7 use group 2k, 8-15 2k+1."""
    return permute(b, sc16, [2 * k] * 8 + [2 * k + 1] * 8)


def _bsum_dot(b: ir.IRBuilder, sp: ir.Value, coef: ir.Value) -> ir.Value:
    """coef[g] * bsum[g] over the 16 groups of 16, summed in pairs to <8 x i32>: one
    vpmaddwd. The bsums are int32 (|bsum| <= 16 * 127, so their low halves are exact i16);
    coef is <16 x i16>: a scale per group, or a sub-block's value twice."""
    bsums = b.trunc(load(b, sp, 0, vec(_i32, 16)), vec(_i16, 16))
    return ISA.i16_pairs(b, bsums, coef)




def _scale_f32x8(b: ir.IRBuilder, isum: ir.Value, scale: ir.Value) -> ir.Value:
    """<8 x i32> -> <8 x f32> times a scalar f32."""
    return b.fmul(b.sitofp(isum, vec(_f32, 8)), splat_value(b, scale, 8))








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
    u = load(b, wp, offset, vec(_i32, 4))  # u0, u1, u2, (quants)
    k1, k2, k3 = 0x3F3F3F3F, 0x0F0F0F0F, 0x03030303

    def words(*values):
        return ir.Constant(vec(_i32, 4), list(values))

    low = b.and_(b.lshr(permute(b, u, [0, 2, 1, 2]), words(0, 0, 0, 4)), words(k1, k2, k1, k2))
    top = b.and_(b.lshr(permute(b, u, [0, 0, 1, 1]), words(6, 6, 6, 6)), words(0, k3, 0, k3))
    return b.bitcast(b.or_(low, b.shl(top, words(4, 4, 4, 4))), vec(_i8, 16))


def _nibble_chunks(b: ir.IRBuilder, wp: ir.Value, offset: int) -> tuple[ir.Value, ir.Value]:
    """32 bytes of packed quants -> (low nibbles, high nibbles), each <32 x u8>. Built as one
    64-byte vector (the bytes twice, the upper copy shifted right by 4 in 16-bit lanes, then
    masked), which the 512-bit path pairs back whole: a broadcast, a variable shift and an
    and, instead of two masks, a shift and a lane insert."""
    q = load(b, wp, offset, vec(_i8, 32))
    both = b.bitcast(permute(b, q, list(range(32)) * 2), vec(_i16, 32))
    both = b.lshr(both, ir.Constant(vec(_i16, 32), [0] * 16 + [4] * 16))
    v = b.and_(b.bitcast(both, vec(_i8, 64)), splat(_i8, 64, 0x0F))
    return permute(b, v, list(range(32))), permute(b, v, list(range(32, 64)))


def _with_mins(wp: ir.Value, d_off: int, dmin_off: int, mins: ir.Value):
    """finish() for w = d*sc*u - dmin*m: dx*d * sum(sc*u.x) - dx*dmin * sum(m*bsum); mins
    is <16 x i16>, one per group of 16."""

    def finish(b, acc, sp, dx):
        d, dmin = load_f16(b, wp, d_off), load_f16(b, wp, dmin_off)
        imin = _bsum_dot(b, sp, mins)
        main = _scale_f32x8(b, acc, b.fmul(dx, d))
        return b.fsub(main, _scale_f32x8(b, imin, b.fmul(dx, dmin)))

    return finish


def _with_offset(wp: ir.Value, d_off: int, sc16: ir.Value, offset_log2: int):
    """finish() for w = d*sc*(u - 2^k): dx*d * (sum(sc*u.x) - 2^k * sum(sc*bsum)); sc16 is
    <16 x i16>."""

    def finish(b, acc, sp, dx):
        corr = _bsum_dot(b, sp, sc16)
        isum = b.sub(acc, b.shl(corr, splat(_i32, 8, offset_log2)))
        return _scale_f32x8(b, isum, b.fmul(dx, load_f16(b, wp, d_off)))

    return finish


def _unpack_q4_k(b: ir.IRBuilder, wp: ir.Value) -> Unpacked:
    # d f16 | dmin f16 | scales[12] | qs[128]; per 32 bytes, low nibbles are sub-block 2c and
    # high nibbles sub-block 2c+1.
    scales_mins = _k4_scales_mins(b, wp, 4)
    sc16 = b.zext(scales_mins, vec(_i16, 16))
    chunks = []
    for j in range(0, 8, 2):
        u_lo, u_hi = _nibble_chunks(b, wp, 16 + 16 * j)
        chunks += [(u_lo, permute(b, sc16, [j] * 16)), (u_hi, permute(b, sc16, [j + 1] * 16))]
    mins = b.zext(permute(b, scales_mins, [8 + j // 2 for j in range(16)]), vec(_i16, 16))
    return Unpacked(chunks, _with_mins(wp, 0, 2, mins))


def _unpack_q5_k(b: ir.IRBuilder, wp: ir.Value) -> Unpacked:
    # d f16 | dmin f16 | scales[12] | qh[32] | qs[128]; as Q4_K, plus bit j of qh[l] as the
    # fifth bit of value l of sub-block j.
    scales_mins = _k4_scales_mins(b, wp, 4)
    sc16 = b.zext(scales_mins, vec(_i16, 16))
    qh = load(b, wp, 16, vec(_i8, 32))
    chunks = []
    for j in range(0, 8, 2):
        for k, low in enumerate(_nibble_chunks(b, wp, 48 + 16 * j)):
            high = b.shl(_bits(b, qh, j + k, 1), splat(_i8, 32, 4))
            chunks.append((b.or_(low, high), permute(b, sc16, [j + k] * 16)))
    mins = b.zext(permute(b, scales_mins, [8 + j // 2 for j in range(16)]), vec(_i16, 16))
    return Unpacked(chunks, _with_mins(wp, 0, 2, mins))


def _unpack_q6_k(b: ir.IRBuilder, wp: ir.Value) -> Unpacked:
    # ql[128] | qh[64] | scales[16] i8 | d f16. Chunk k (half h = k//4, s = k%4): low 4 bits
    # from ql[64h + 32(s%2) + l] >> 4(s//2), high 2 bits from qh[32h + l] >> 2s; value u - 32.
    sc8 = load(b, wp, 192, vec(_i8, 16))
    sc16 = b.sext(sc8, vec(_i16, 16))
    chunks = []
    for k in range(8):
        h, s = divmod(k, 4)
        low = _bits(b, load(b, wp, 64 * h + 32 * (s % 2), vec(_i8, 32)), 4 * (s // 2), 0x0F)
        high = _bits(b, load(b, wp, 128 + 32 * h, vec(_i8, 32)), 2 * s, 0x03)
        u = b.or_(low, b.shl(high, splat(_i8, 32, 4)))
        chunks.append((u, _scales16_per_16(b, sc16, k)))
    return Unpacked(chunks, _with_offset(wp, 208, sc16, 5))


def _q3_k_scales(b: ir.IRBuilder, wp: ir.Value, offset: int) -> ir.Value:
    """Q3_K 12-byte 6-bit scales -> <16 x i8> signed (value - 32), llama.cpp's kmask unpacking:
    low 4 bits from bytes 0-7 (low then high nibbles), high 2 bits from bytes 8-11."""
    u0, u1, u2 = (load(b, wp, offset + 4 * i, _i32) for i in range(3))
    k1, k2 = ir.Constant(_i32, 0x03030303), ir.Constant(_i32, 0x0F0F0F0F)

    def sh(v, n):
        return b.lshr(v, ir.Constant(_i32, n)) if n else v

    def word(low, hshift):
        return b.or_(b.and_(low, k2), b.shl(b.and_(sh(u2, hshift), k1), ir.Constant(_i32, 4)))

    words = [word(u0, 0), word(u1, 2), word(sh(u0, 4), 4), word(sh(u1, 4), 6)]
    sc = b.bitcast(from_scalars(b, words), vec(_i8, 16))
    return b.sub(sc, splat(_i8, 16, 32))


def _unpack_q3_k(b: ir.IRBuilder, wp: ir.Value) -> Unpacked:
    # hmask[32] | qs[64] | scales[12] | d f16. Chunk k (h = k//4, s = k%4): 2 low bits from
    # qs[32h + l] >> 2s, third bit = bit k of hmask[l]; value u - 4.
    sc8 = _q3_k_scales(b, wp, 96)
    sc16 = b.sext(sc8, vec(_i16, 16))
    hmask = load(b, wp, 0, vec(_i8, 32))
    chunks = []
    for k in range(8):
        h, s = divmod(k, 4)
        low = _bits(b, load(b, wp, 32 + 32 * h, vec(_i8, 32)), 2 * s, 0x03)
        u = b.or_(low, b.shl(_bits(b, hmask, k, 1), splat(_i8, 32, 2)))
        chunks.append((u, _scales16_per_16(b, sc16, k)))
    return Unpacked(chunks, _with_offset(wp, 108, sc16, 2))


def _unpack_q2_k(b: ir.IRBuilder, wp: ir.Value) -> Unpacked:
    # scales[16] (low nibble scale, high nibble min) | qs[64] | d f16 | dmin f16.
    # Chunk k (h = k//4, s = k%4): value = qs[32h + l] >> 2s & 3.
    packed = load(b, wp, 0, vec(_i8, 16))
    sc16 = b.zext(_bits(b, packed, 0, 0x0F), vec(_i16, 16))
    chunks = []
    for k in range(8):
        h, s = divmod(k, 4)
        u = _bits(b, load(b, wp, 16 + 32 * h, vec(_i8, 32)), 2 * s, 0x03)
        chunks.append((u, _scales16_per_16(b, sc16, k)))
    mins = b.zext(_bits(b, packed, 4, 0x0F), vec(_i16, 16))
    return Unpacked(chunks, _with_mins(wp, 80, 82, mins))


# ---------------------------------------------------------------------------------------------
# Numba glue: one intrinsic computes a whole row against TILE tokens, looping over the
# super-blocks in IR so the f32 accumulators stay <8 x f32> registers until the end of the row.
# The weights are unpacked once per block for all TILE tokens.
# ---------------------------------------------------------------------------------------------

# Weights are read once, in order, but the hardware prefetcher alone falls well short of the
# in-cache speed once the matrix outgrows the last-level cache; asking for the bytes
# PREFETCH_BYTES ahead (about a row) restores it (docs/performance.md, Kernels).
PREFETCH_BYTES = 2048
TILE = 8  # tokens per weight-block unpack (prefill, batches)
ROWS_PER_CHUNK = 8  # rows per chunk

# qtype -> (unpack, block bytes), filled by _make_matmul.
_UNPACKERS: dict[int, tuple[Callable[[ir.IRBuilder, ir.Value], Unpacked], int]] = {}


def _prefetch(b: ir.IRBuilder, wp: ir.Value, block_bytes: int) -> None:
    for line in range(0, block_bytes, 64):
        prefetch(b, b.gep(wp, [ir.Constant(_i32, PREFETCH_BYTES + line)]), locality=3)


def _literal_int(ty) -> int:
    if not isinstance(ty, types.IntegerLiteral):
        raise TypingError("_row_dot needs compile-time constant qtype and tile")
    return ty.literal_value


def _accumulate_block(b, unpacked: Unpacked, xq: Array2D, xd: Array2D, xs: Array2D, toks, blk,
                      accs):
    """accs[t] (<8 x f32>* ) += this weight block against token toks[t]'s block blk."""
    for tok, acc_ptr in zip(toks, accs):
        xp, sp = xq.block(tok, blk, QK_K), xs.block(tok, blk, 64)
        dx = b.load(b.bitcast(xd.block(tok, blk, 4), _f32.as_pointer()))
        if ISA.superblock_sums_zmm is not None:  # two chunks per 512-bit instruction
            isum = ISA.superblock_sums_zmm(b, unpacked.chunks, xp)
        else:
            isum = None
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
        w, xq, xd, xs = (Array2D(context, builder, sig.args[i], args[i]) for i in (2, 4, 5, 6))
        toks = [builder.add(tok, ir.Constant(tok.type, t)) for t in range(n_tile)]
        zero = ir.Constant(vec(_f32, 8), [0.0] * 8)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(n_tile)]
        # the weight row fixes n_in: activation buffers may be wider (shared scratch space)
        n_blk = builder.udiv(w.n_cols, ir.Constant(tok.type, block_bytes))
        with cgutils.for_range(builder, n_blk) as loop:
            wp = w.block(row, loop.index, block_bytes)
            _prefetch(builder, wp, block_bytes)
            unpacked = unpack(builder, wp)  # once for all the tile's tokens
            _accumulate_block(builder, unpacked, xq, xd, xs, toks, loop.index, accs)
        values = [tree_sum(builder, builder.load(acc_ptr)) for acc_ptr in accs]
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
    threads, and so do decode batches from Q8_K_PARALLEL_VALUES values."""
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
