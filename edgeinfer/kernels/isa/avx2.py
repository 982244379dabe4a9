"""AVX2 integer dot products (llama.cpp's AVX2 path): vpmaddubsw's u8 x s8 pair sums, then
vpmaddwd; signed weights by the sign trick (vpsignb). And the legacy kernels' AVX2 steps: 8
blocks per step on the grouped activations (ymm_step), then 2 (pair_step)."""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from edgeinfer.kernels.actquant import GROUP
from edgeinfer.kernels.ir import (
    call,
    fence,
    load,
    load_f16,
    opaque,
    prefetch,
    repeat_lanes,
    shuffle,
    splat,
    vec,
)
from edgeinfer.kernels.legacy_blocks import ymm_scales

NAME = "avx2"
_I8, _I16, _I32, _I64 = (ir.IntType(n) for n in (8, 16, 32, 64))
_F32 = ir.FloatType()

# ---- integer products


def u8s8_pairs(builder, u, s):
    """<32 x u8> * <32 x s8> -> <16 x i16> sums of adjacent products, saturating (callers
    keep them below 2^15)."""
    return call(builder, "llvm.x86.avx2.pmadd.ub.sw", vec(_I16, 16), u, s)


def i16_pairs(builder, p, s):
    """<16 x i16> * <16 x i16> -> <8 x i32> sums of adjacent products."""
    return call(builder, "llvm.x86.avx2.pmadd.wd", vec(_I32, 8), p, s)


def i16_pairs_add(builder, acc, p, s):
    """acc + i16_pairs(p, s); acc None: the products alone."""
    part = i16_pairs(builder, p, s)
    return part if acc is None else builder.add(acc, part)


def _u8s8_dot(builder, u, s):
    """dot of unsigned bytes u with signed bytes s as <8 x i32>. u <= 128 and |s| <= 127
    here, so the i16 pair sums of vpmaddubsw (<= 32512) cannot saturate."""
    return i16_pairs(builder, u8s8_pairs(builder, u, s), ir.Constant(vec(_I16, 16), [1] * 16))


def i8_dot(builder, a, b, a_unsigned: bool):
    """Exact dot of 32 weight bytes a and activations b (|b| <= 127) as <8 x i32> partial
    sums: |a| times b carrying a's sign (vpsignb), as llama.cpp's mul_sum_i8_pairs; the `_1`
    formats' weights are already unsigned."""
    if a_unsigned:
        return _u8s8_dot(builder, a, b)
    abs_a = call(builder, "llvm.x86.avx2.psign.b", a.type, a, a)
    signed_b = call(builder, "llvm.x86.avx2.psign.b", b.type, b, a)
    return _u8s8_dot(builder, abs_a, signed_b)


scaled_dot = None  # u8s8_pairs, then i16_pairs_add: vpmaddubsw + vpmaddwd


# ---- the legacy kernels' block loop (legacy._Tile; the names are generic.py's)

# The `_1` formats (Q4_1, Q5_1) take 8 blocks per step from the grouped activations in
# 32-byte registers (ymm_step), then 2 (pair_step), then one block at a time. The others keep
# llama.cpp's AVX2 order, one FMA of 8 partial sums per block, and so its exact results: any
# other order moves gemma-3's logits by up to 1.2 (activation roundings flip), enough to flip
# a golden decode step. The output head is the exception (HEAD_KERNELS): no later rounding
# depends on the logits, so its kernels take the 8-block step on every format.
YMM_STEPS = GROUP == 8  # actquant groups the activations for it
BLOCKS_PER_STEP = 1
BIASED_WEIGHTS = False
STEPS_ADD_MINS = False
ONE_TAIL_STEP = False
HEAD_KERNELS = YMM_STEPS


def block_dot(builder, q, x, corr, unsigned: bool):
    return i8_dot(builder, q, x, unsigned)


def bias_correction(builder, x, bias: int, lanes: int):
    return ir.Constant(vec(_I32, lanes), [0] * lanes)


def step_scales(builder, d, toks: int):
    """opaque with several tokens: else LLVM folds splat(d_w) * splat(d_x) to a scalar
    product and a broadcast per row x token, where one vector product with d_x broadcast
    from memory is one ALU op fewer (the same f32 product). One token has nothing to share:
    there the barrier costs (docs/performance.md, Kernels)."""
    return opaque(builder, d, "=x,0") if toks > 1 else d


def tile_rows(fmt) -> int:
    """1 row with the 8-block step, whose 8 weight registers leave no room for 16
    accumulators among AVX2's 16 registers; else 2."""
    return 1 if YMM_STEPS and fmt.ymm is not None else 2


def wide_steps(tile, builder, w_rows, ahead, toks, n_blocks, accs):
    if not (YMM_STEPS and tile.fmt.ymm is not None):
        return _I64(0), _I64(0)
    n_oct = builder.udiv(n_blocks, _I64(8))
    with cgutils.for_range(builder, n_oct) as loop:
        ymm_step(tile, builder, w_rows, ahead, toks, builder.mul(loop.index, _I64(8)), accs)
    done = builder.mul(n_oct, _I64(8))
    n_pair = builder.udiv(builder.sub(n_blocks, done), _I64(2))
    with cgutils.for_range(builder, n_pair) as loop:
        pair_step(tile, builder, w_rows, ahead, toks,
                  builder.add(done, builder.mul(loop.index, _I64(2))), accs)
    done = builder.add(done, builder.mul(n_pair, _I64(2)))
    return done, done


def _rows_here(tile, builder):
    """The tokens' activation rows, computed in the step from the first token's and the row
    strides, hidden from LLVM so that it does not hoist them: the 24 row pointers of 8
    tokens, kept across the block loop, spill and come back as loads on the ports the
    activations need."""
    first, strides = tile.firsts
    strides = [opaque(builder, st) for st in strides]
    return [[builder.gep(base, [builder.mul(_I64(t), st)]) for base, st in zip(first, strides)]
            for t in range(tile.toks)]


def ymm_step(tile, builder, w_rows, ahead, toks, i, accs):
    """Adds blocks i .. i+7 (the `_1` formats, and the others' output head; grouped
    activations). Register j, lane b of weights and activations holds value dword
    YMM_DWORDS[j] of block b, so lane b of every product stays block b's. The unsigned
    weights (u <= 15) add 8 vpmaddubsw's i16 pair sums before one vpmaddwd (8 x 2 x 15 x
    127 < 2^15; 5-bit weights 4), so one conversion, scale product and FMA serve 256
    products where the one-block step's served 32. Q4_0 / Q5_0 weights are biased (u = value
    + bias) and corrected by the block sums the quantizer stored; Q8_0 takes the sign trick,
    a vpmaddwd per register. The minimums' term m_w * s_x of the 8 blocks is one more FMA
    here (their lanes match), m_w from the same gather as d_w. Rows outer, then registers,
    then tokens (_ymm_sums); the activations reloaded by each row."""
    vi = vec(_I32, 8)
    signed = tile.max_u > 127  # Q8_0: llama.cpp's sign trick, a vpmaddwd per register
    per_sum = 1 if signed else 32767 // (2 * 127 * tile.max_u)
    ones = ir.Constant(vec(_I16, 16), [1] * 16)
    if len(toks) > 1:
        toks = _rows_here(tile, builder)
    for r, w_row in enumerate(w_rows):
        blks = tile.blocks(builder, w_row, i, 8)
        for line in range(0, 8 * tile.block_bytes, 64):
            prefetch(builder, builder.gep(blks[0], [builder.add(ahead, _I64(line))]))
        regs = tile.fmt.ymm(builder, blks)
        if signed:
            regs = [builder.sub(q, splat(_I8, 32, tile.bias)) for q in regs]
        d_w, m_w = ymm_scales(builder, blks[0], tile.block_bytes)
        at = opaque(builder, i)
        x_at, d_at = builder.mul(at, _I64(32)), builder.mul(at, _I64(4))
        isums = _ymm_sums(builder, regs, toks, x_at, signed, per_sum, ones)
        for t, (xq, xd, xs) in enumerate(toks):
            isum = isums[t]
            if tile.bias and not signed:  # the quantizer stored minus each block's sum
                corr = load(builder, xs, d_at, vi)
                isum = builder.add(isum, builder.mul(corr, ir.Constant(vi, [tile.bias] * 8)))
            d_x = load(builder, xd, d_at, vec(_F32, 8))
            tile.scale_add(builder, accs[r][t], isum, d_w, d_x)
            if tile.has_min:  # the minimums' term, in place
                s_x = load(builder, xs, d_at, vec(_F32, 8))
                tile.fma_into(builder, accs[r][t], m_w, s_x)


def _ymm_sums(builder, regs, toks, x_at, signed: bool, per_sum: int, ones):
    """Each token's <8 x i32> integer sums of one row's 8 registers (ymm_step). Registers
    outer, tokens inner: one weight register (two with the sign trick) and a running sum per
    token are live, where all 8 (16) weight registers live across the tokens spill with
    AVX2's 16 registers."""
    v32 = vec(_I8, 32)
    sums = [None] * len(toks)  # i32 sums so far
    pairs = [None] * len(toks)  # i16 pair sums of the current run of per_sum registers
    for j, q in enumerate(regs):
        for t, (xq, _, _) in enumerate(toks):
            x = load(builder, xq, builder.add(x_at, _I64(32 * j)), v32)
            if signed:
                part = i8_dot(builder, q, x, a_unsigned=False)
            else:
                p = u8s8_pairs(builder, q, x)
                pairs[t] = p if j % per_sum == 0 else builder.add(pairs[t], p)
                if j % per_sum != per_sum - 1 and j != len(regs) - 1:
                    continue
                part = i16_pairs(builder, pairs[t], ones)
            sums[t] = part if sums[t] is None else builder.add(sums[t], part)
        if j + 1 < len(regs):  # register j's work for every token before j + 1's
            if signed or j % per_sum == per_sum - 1:
                sums = fence(builder, sums)
            else:
                pairs = fence(builder, pairs)
    return sums


def pair_step(tile, builder, w_rows, ahead, toks, i, accs):
    """Adds blocks i, i+1 (past the row's last 8-block group; actquant's pair order): i32
    lanes 0-3 of a product are block i's, 4-7 block i+1's, so one conversion, scale product
    and FMA serve both blocks, and the `_1` formats' minimums are one more FMA (m_w in lanes
    0 and 4 only)."""
    signed = tile.bias != 0  # the pair decoders give signed values: the sign trick
    ones = ir.Constant(vec(_I16, 16), [1] * 16)
    halves_of = [k // 4 for k in range(8)]  # lane -> block of the pair
    for r, w_row in enumerate(w_rows):
        blks = tile.blocks(builder, w_row, i, 2)
        for line in range(0, 2 * tile.block_bytes, 64):
            prefetch(builder, builder.gep(blks[0], [builder.add(ahead, _I64(line))]))
        regs = tile.fmt.pair(builder, blks)
        d_w = repeat_lanes(builder, [load_f16(builder, b, 0) for b in blks], 4)
        m_w = None
        if tile.has_min:  # each block's minimum once: lanes 0 and 4
            m = repeat_lanes(builder, [load_f16(builder, b, 2) for b in blks], 4)
            m_w = shuffle(builder, m, ir.Constant(m.type, [0.0] * 8), [0, 8, 8, 8, 4, 8, 8, 8])
        at = opaque(builder, i)
        x_at, d_at = builder.mul(at, _I64(32)), builder.mul(at, _I64(4))
        for t, (xq, xd, xs) in enumerate(toks):
            x = [load(builder, xq, builder.add(x_at, _I64(32 * h)), vec(_I8, 32))
                 for h in range(2)]
            if signed:
                isum = builder.add(*[i8_dot(builder, q, v, a_unsigned=False)
                                     for q, v in zip(regs, x)])
            else:
                pairs = [u8s8_pairs(builder, q, v) for q, v in zip(regs, x)]
                isum = i16_pairs(builder, builder.add(*pairs), ones)
            d_x = load(builder, xd, d_at, vec(_F32, 2))
            tile.scale_add(builder, accs[r][t], isum, d_w, shuffle(builder, d_x, d_x, halves_of))
            if m_w is not None:
                s_x = load(builder, xs, d_at, vec(_F32, 2))
                tile.fma_into(builder, accs[r][t], m_w, shuffle(builder, s_x, s_x, halves_of))


# ---- the k-quant kernels

superblock_sums_zmm = None
