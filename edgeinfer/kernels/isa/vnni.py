"""VNNI integer dot products (AVX-VNNI, AVX512-VNNI): vpdpbusd adds the sums of 4 adjacent
u8 x s8 products into i32 lanes in one instruction, vpdpwssd those of 2 i16 x i16 products.
The weights stay unsigned (value + bias) and the bias times the activations' block sum is
subtracted exactly, seeded into the accumulator. With 512-bit registers (AVX512_VNNI) the
legacy kernels take 8 blocks per step on grouped activations (oct_step), then 4
(quad_step), then 2, and the k-quant kernels two 32-value chunks per instruction."""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from edgeinfer.kernels.actquant import GROUP
from edgeinfer.kernels.f16 import half_to_f32
from edgeinfer.kernels.ir import (
    call,
    concat,
    load,
    load_f16,
    loop_or_once,
    opaque,
    permute,
    prefetch,
    repeat_lanes,
    shuffle,
    splat,
    vec,
)
from edgeinfer.kernels.isa.avx2 import i8_dot, i16_pairs, u8s8_pairs  # noqa: F401
from edgeinfer.kernels.legacy_blocks import block_words, halves, oct_scales
from edgeinfer.kernels.target import AVX512_VNNI

NAME = "vnni"
_I8, _I16, _I32, _I64 = (ir.IntType(n) for n in (8, 16, 32, 64))
_F32 = ir.FloatType()

# ---- integer products


def vpdpbusd(builder, acc, u, s):
    """acc + sums of 4 adjacent u8*s8 products, exact in i32 (no saturation): 8 or 16 lanes."""
    n = acc.type.count
    vi = vec(_I32, n)
    name = "llvm.x86.avx512.vpdpbusd.512" if n == 16 else "llvm.x86.avx512.vpdpbusd.256"
    return call(builder, name, vi, acc, builder.bitcast(u, vi), builder.bitcast(s, vi))


def i16_pairs_add(builder, acc, p, s):
    """acc + i16_pairs(p, s) by one vpdpwssd; acc None: the products alone (vpmaddwd)."""
    if acc is None:
        return i16_pairs(builder, p, s)
    v8 = vec(_I32, 8)
    return call(builder, "llvm.x86.avx512.vpdpwssd.256", v8, acc, builder.bitcast(p, v8),
                builder.bitcast(s, v8))


scaled_dot = None  # u8s8_pairs, then i16_pairs_add: vpmaddubsw + vpdpwssd


# ---- the legacy kernels' block loop (legacy._Tile; the names are generic.py's)

# Blocks per step of the block loop. With AVX-512 the main loop takes 8 blocks per step
# from the grouped activations (oct_step, four vpdpbusd per i32 lane); the blocks past the
# last whole group 4 (quad_step, two per lane), then 2 at a time (two blocks share a zmm
# register, which halves the int->float conversions, scale products and FMAs per block),
# then the odd one. With 256-bit VNNI one block per step.
BLOCKS_PER_STEP = 2 if AVX512_VNNI else 1
QUAD_STEPS = AVX512_VNNI
OCT_STEPS = AVX512_VNNI and GROUP == 8  # actquant groups the activations on the same flag
BIASED_WEIGHTS = True
STEPS_ADD_MINS = OCT_STEPS  # every AVX-512 step adds the `_1` formats' minimums term
ONE_TAIL_STEP = OCT_STEPS  # fewer than 8 blocks are left after the 8-block steps
HEAD_KERNELS = False


def block_dot(builder, q, x, corr, unsigned: bool):
    """corr + dot(u, x): the bias correction seeded into vpdpbusd's accumulator."""
    return vpdpbusd(builder, corr, q, x)


def bias_correction(builder, x, bias: int, lanes: int):
    """-bias * the sums of x over each lane's 4 bytes (one vpdpbusd against ones)."""
    vi = vec(_I32, lanes)
    zero = ir.Constant(vi, [0] * lanes)
    if not bias:
        return zero
    x_sum = vpdpbusd(builder, zero, splat(_I8, 4 * lanes, 1), x)
    return builder.mul(x_sum, ir.Constant(vi, [-bias] * lanes))


def step_scales(builder, d, toks: int):
    return d


def tile_rows(fmt) -> int:
    """2 rows (x up to 8 tokens): with 32 zmm registers the 8-block step runs tokens outer,
    so each token's activations and bias correction are loaded once for both rows."""
    return 2


def wide_steps(tile, builder, w_rows, ahead, toks, n_blocks, accs):
    done = _I64(0)
    if OCT_STEPS:
        n_oct = builder.udiv(n_blocks, _I64(8))
        with cgutils.for_range(builder, n_oct) as loop:
            oct_step(tile, builder, w_rows, ahead, toks, builder.mul(loop.index, _I64(8)), accs)
        done = builder.mul(n_oct, _I64(8))
    if QUAD_STEPS:
        n_quad = builder.udiv(builder.sub(n_blocks, done), _I64(4))
        with loop_or_once(builder, n_quad, ONE_TAIL_STEP) as k:
            quad_step(tile, builder, w_rows, ahead, toks,
                      builder.add(done, builder.mul(k, _I64(4))), accs)
        done = builder.add(done, builder.mul(n_quad, _I64(4)))
    return done, _I64(0)


def _quad_weights(tile, builder, w_row, ahead, i):
    """Blocks i..i+3 of one row: (lo, hi) <64 x u8> and d <16 x f32> (d_k in lanes 4k..)."""
    blks = tile.blocks(builder, w_row, i, 4)
    for line in range(0, 4 * tile.block_bytes, 64):
        prefetch(builder, builder.gep(blks[0], [builder.add(ahead, _I64(line))]))
    lo, hi = tile.fmt.quad(builder, blks)
    return lo, hi, repeat_lanes(builder, [load_f16(builder, b, 0) for b in blks], 4)


def quad_step(tile, builder, w_rows, ahead, toks, i, accs):
    """Adds blocks i..i+3. Lane group k (4 i32 lanes) of a product holds block i+k: a
    vpdpbusd on values 0..15 of the four blocks, then one on values 16..31 into the same
    lanes, so each int->float conversion, scale product and FMA serves 128 products where
    the two-block step's served 64. The activations are regrouped to match by two 128-bit
    lane shuffles per token. The `_1` formats' minimums term m_w * s_x is one more FMA per
    row and token (m_w of block k in lane 4k, lane_mins), as in the other steps."""
    vi, v64 = vec(_I32, 16), vec(_I8, 64)
    lanes = [k for k in range(4) for _ in range(4)]  # block of each lane
    weights = [_quad_weights(tile, builder, w_row, ahead, i) for w_row in w_rows]
    mins = ([tile.lane_mins(builder, w_row, i, 4, 4) for w_row in w_rows]
            if tile.has_min else [])
    zero = ir.Constant(vi, [0] * 16)
    for t, (xq, xd, xs) in enumerate(toks):
        x_a = load(builder, xq, builder.mul(i, _I64(32)), v64)
        x_b = load(builder, xq, builder.add(builder.mul(i, _I64(32)), _I64(64)), v64)
        x_lo, x_hi = halves(builder, x_a, x_b)
        d_x = load(builder, xd, builder.mul(i, _I64(4)), vec(_F32, 4))
        d_x = shuffle(builder, d_x, d_x, lanes)
        corr = zero
        if tile.bias:
            ones = splat(_I8, 64, 1)
            x_sum = vpdpbusd(builder, vpdpbusd(builder, zero, ones, x_lo), ones, x_hi)
            corr = builder.mul(x_sum, ir.Constant(vi, [-tile.bias] * 16))
        if mins:  # the blocks' sums d_x * sum(x), Q8_1's s
            s_x = load(builder, xs, builder.mul(i, _I64(4)), vec(_F32, 4))
            s_x = shuffle(builder, s_x, s_x, lanes)
        for r, (lo, hi, d_w) in enumerate(weights):
            isum = vpdpbusd(builder, vpdpbusd(builder, corr, lo, x_lo), hi, x_hi)
            tile.scale_add(builder, accs[r][t], isum, d_w, d_x)
            if mins:
                tile.fma_into(builder, accs[r][t], mins[r], s_x)


def _oct_weights(tile, builder, w_row, ahead, i):
    """Blocks i..i+7 of one row for oct_step: (4 <64 x u8> registers, d <16 x f32>)."""
    blks = tile.blocks(builder, w_row, i, 8)
    for line in range(0, 8 * tile.block_bytes, 64):
        prefetch(builder, builder.gep(blks[0], [builder.add(ahead, _I64(line))]))
    # opaque: else LLVM multiplies d_w by d_x in 8 lanes and then copies the product into
    # the upper 8 (a port-5 shuffle per row and token)
    return tile.fmt.oct(builder, blks), opaque(
        builder, oct_scales(builder, blks[0], tile.block_bytes), "=v,0")


def _oct_mins(tile, builder, w_row, i):
    """m (the f16 at byte 2) of blocks i..i+7 as <16 x f32>: block b's in lane b, zero in
    lanes 8..15 (the oct step's accumulators hold block b in lanes b and b + 8)."""
    blk = builder.gep(w_row, [builder.mul(i, _I64(tile.block_bytes))])
    m = half_to_f32(builder, block_words(builder, blk, tile.block_bytes, 2, 1))
    zeros = ir.Constant(m.type, [0.0] * 8)
    return opaque(builder, shuffle(builder, m, zeros, list(range(16))), "=v,0")


def oct_step(tile, builder, w_rows, ahead, toks, i, accs):
    """Adds blocks i..i+7 (grouped activations). Block b's 32 products sum into i32 lanes b
    and b + 8 by four vpdpbusd, so each conversion, scale product and FMA serves 256
    products. The activations need no shuffles: the quantizer stored them in this order,
    and for the bias correction each lane's sum.

    Tokens outer (tiles of up to two rows, tile_rows), so each token's 4 activation
    registers, bias correction and, for the `_1` formats, block sums are loaded once for
    both rows, whose 8 weight registers stay live beside the 16 accumulators. The `_1`
    formats' minimums term m_w * s_x of the 8 blocks is one more FMA per row and token, in
    lanes 0..7 (lanes 8..15 of m_w are zero)."""
    vi, v64 = vec(_I32, 16), vec(_I8, 64)

    def token(at, xq, xd, xs):
        """(activation registers, d_x, the bias correction) of one token."""
        x_at, d_at = builder.mul(at, _I64(32)), builder.mul(at, _I64(4))
        x = [load(builder, xq, builder.add(x_at, _I64(64 * k)), v64) for k in range(4)]
        d_x = load(builder, xd, d_at, vec(_F32, 8))
        corr = ir.Constant(vi, [0] * 16)
        if tile.bias:  # the quantizer stored minus each lane's activation sum (GROUP_SUMS)
            sums = load(builder, xs, builder.mul(at, _I64(8)), vi)
            corr = builder.mul(sums, ir.Constant(vi, [tile.bias] * 16))
        return x, shuffle(builder, d_x, d_x, list(range(8)) * 2), corr

    def add(acc, regs, d_w, x, d_x, corr):
        isum = corr
        for w, v in zip(regs, x):
            isum = vpdpbusd(builder, isum, w, v)
        tile.scale_add(builder, acc, isum, d_w, d_x)

    weights = [_oct_weights(tile, builder, w_row, ahead, i) for w_row in w_rows]
    mins = [_oct_mins(tile, builder, w_row, i) for w_row in w_rows] if tile.has_min else []
    for t, tok in enumerate(toks):
        x, d_x, corr = token(i, *tok)
        if mins:  # the tokens' block sums d_x * sum(x), Q8_1's s
            s_x = load(builder, tok[2], builder.mul(i, _I64(4)), vec(_F32, 8))
            s_x = shuffle(builder, s_x, s_x, list(range(8)) * 2)
        for r, (regs, d_w) in enumerate(weights):
            add(accs[r][t], regs, d_w, x, d_x, corr)
            if mins:
                tile.fma_into(builder, accs[r][t], mins[r], s_x)


# ---- the k-quant kernels


def _superblock_sums_zmm(builder, chunks, xp):
    """A k-quant super-block's <8 x i32> sums of scale * u * x two 32-value chunks per
    512-bit vpmaddubsw / vpdpwssd, then the two halves added."""
    v16 = vec(_I32, 16)
    isum = ir.Constant(v16, [0] * 16)
    for k in range(0, len(chunks), 2):
        (u0, s0), (u1, s1) = chunks[k : k + 2]
        x = load(builder, xp, 32 * k, vec(_I8, 64))
        pairs = call(builder, "llvm.x86.avx512.pmaddubs.w.512", vec(_I16, 32),
                     concat(builder, [u0, u1]), x)
        scales = builder.bitcast(concat(builder, [s0, s1]), v16)
        isum = call(builder, "llvm.x86.avx512.vpdpwssd.512", v16, isum,
                    builder.bitcast(pairs, v16), scales)
    return builder.add(permute(builder, isum, list(range(8))),
                       permute(builder, isum, list(range(8, 16))))


superblock_sums_zmm = _superblock_sums_zmm if AVX512_VNNI else None
