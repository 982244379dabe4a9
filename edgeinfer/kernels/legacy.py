"""Matrix-product kernels for the legacy GGML quant types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1.

Each kernel has the registry's uniform signature `kernel(w, xq, xd, xs, xf, out)` and writes
out[t, r] = dot(w[r], x[t]) for every token t and output row r.

Integer types follow llama.cpp's `ggml_vec_dot_*_q8_*` (ggml-cpu/arch/x86/quants.c): per
32-value block an exact integer dot product into 8 int32 lanes, converted to f32 and
accumulated with one FMA by d_w*d_x into an f32 vector accumulator that lives across blocks;
the `_1` types add sum(m_w * s_x) separately. The block loop is hand-written LLVM vector IR
(`numba.extending.intrinsic`): LLVM's auto-vectorizers were fragile on nibble formats
(kernels.md, facts 1-6). The integer dot is chosen once from the CPU numba targets
(DOT_PATH): `vpdpbusd` (AVX-VNNI / AVX512-VNNI) on unsigned weights (value + bias, the bias
times the activations' block sum subtracted exactly), with AVX-512 eight blocks per step of
the block loop, four vpdpbusd into the same lanes, on activations the quantizer stored in
that step's register order (_Tile.oct_step, actquant.GROUP); else `vpmaddubsw` +
`vpmaddwd` (AVX2) with llama.cpp's sign trick, for the `_1` formats (and the other formats'
output-head kernels, LOGITS) eight blocks per step on the same grouped activations
(_Tile.ymm_step), the rest of the row two blocks per step (_Tile.pair_step); else portable
IR (NEON, NUMBA_CPU_NAME=generic). The integer sums are exact on every path. The weight
blocks are decoded by legacy_blocks.py.

The float types (F32, F16, BF16) are in floats.py.

Tiling: one intrinsic call computes a register tile of 1 or 2 rows (_tile_rows) x 8 tokens
(prefill, batches of 8+; smaller batches 4, 2 or 1): each weight block is decoded once per 8
tokens, each activation block loaded once per tile's rows, and the accumulators stay in
registers (or, on AVX2's 2-row tiles, in L1) for the whole row; at the end all of a tile's
accumulators are summed across their lanes together (emit.hsums). Parallelism: chunks of about
ROWS_PER_CHUNK rows, whose weights stay in L1 while the tokens stream past (products of up to
8 tokens: DECODE_ROWS_PER_CHUNK, fewer chunk starts where nothing stays); each thread runs
a contiguous share of them, then helps with the others' (schedule.py); products under
SERIAL_WORK run on the calling thread.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba import literally, njit, prange, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from edgeinfer.kernels.actquant import (
    GROUP,
    Q8_0_ACT,
    Q8_0_GROUPED_ACT,
    Q8_1_ACT,
)
from edgeinfer.kernels.emit import (
    Array2D,
    call,
    fence,
    fma,
    hsums,
    lanes_of,
    opaque,
    prefetch,
    repeat_lanes,
)
from edgeinfer.kernels.f16 import half_to_f32
from edgeinfer.kernels.legacy_blocks import (
    BLOCK_FORMATS,
    BlockFormat,
    block_dwords,
    block_words,
    halves,
    load,
    load_f16,
    oct_scales,
    shuffle,
    splat,
    splat_value,
    vec,
    ymm_scales,
)
from edgeinfer.kernels.registry import register
from edgeinfer.kernels.schedule import chunk_counters, n_workers, next_chunk
from edgeinfer.kernels.target import AVX512_VNNI, DOT_PATH

_I1, _I8, _I16, _I32, _I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
_F32 = ir.FloatType()


# ---- the block dot product


# Blocks per step of the block loop. With AVX-512 VNNI the main loop takes 8 blocks per
# step from the grouped activations (_Tile.oct_step, four vpdpbusd per i32 lane); the blocks
# past the last whole group 4 (_Tile.quad_step, two per lane), then 2 at a time (two blocks
# share a zmm register, which halves the int->float conversions, scale products and FMAs
# per block), then the odd one. Elsewhere one block per step.
BLOCKS_PER_STEP = 2 if AVX512_VNNI else 1
QUAD_STEPS = BLOCKS_PER_STEP == 2
OCT_STEPS = QUAD_STEPS and GROUP == 8  # actquant groups the activations on the same flag
# AVX2 without VNNI: the `_1` formats (Q4_1, Q5_1) take 8 blocks per step from the same
# grouped activations in 32-byte registers (_Tile.ymm_step), then one block at a time. The
# others keep llama.cpp's AVX2 order, one FMA of 8 partial sums per block, and so its exact
# results: with the 8-block step on Q5_0 and Q8_0 too, gemma-3's logits moved by up to 1.2
# (activation roundings flip), enough to flip a flash-attention golden decode step. The `_1`
# formats never matched llama.cpp exactly (it adds the minimums' sum apart, in scalar).
# The output head is the exception: no later rounding depends on the logits, which another
# order moves by ulps, so its kernels (code + LOGITS) take the 8-block step on every format
# (an 8-token Q8_0 product 1.3-1.4x faster, Q5_0 1.5x, Q4_0 1.7x).
YMM_STEPS = DOT_PATH == "avx2" and GROUP == 8
LOGITS = 1 << 8  # a kernel code: its GGML type, plus LOGITS for the output head's variant


def _block_format(code: int) -> BlockFormat:
    """The BLOCK_FORMATS entry of a kernel code, without the AVX2 8-block decoders where the
    kernel keeps llama.cpp's block order."""
    fmt = BLOCK_FORMATS[code & (LOGITS - 1)]
    wide = fmt.has_min or code & LOGITS
    return fmt if wide else fmt._replace(ymm=None, pair=None)


def _dot_generic(builder, a, b):
    """Portable: sext to i16, even/odd products widened to i32 and added -> <8 x i32>."""
    a16 = builder.sext(a, vec(_I16, 32))
    b16 = builder.sext(b, vec(_I16, 32))
    even, odd = list(range(0, 32, 2)), list(range(1, 32, 2))

    def widened(v, idx):
        return builder.sext(shuffle(builder, v, v, idx), vec(_I32, 16))

    prod_e = builder.mul(widened(a16, even), widened(b16, even))
    prod_o = builder.mul(widened(a16, odd), widened(b16, odd))
    pairs = builder.add(prod_e, prod_o)  # <16 x i32>
    lo = shuffle(builder, pairs, pairs, list(range(8)))
    hi = shuffle(builder, pairs, pairs, list(range(8, 16)))
    return builder.add(lo, hi)


def _vpdpbusd(builder, acc, u, s):
    """acc + sums of 4 adjacent u8*s8 products, exact in i32 (no saturation): 8 or 16 lanes."""
    n = acc.type.count
    vi = vec(_I32, n)
    name = "llvm.x86.avx512.vpdpbusd.512" if n == 16 else "llvm.x86.avx512.vpdpbusd.256"
    return call(builder, name, vi, acc, builder.bitcast(u, vi), builder.bitcast(s, vi))


def _dot_u8s8(builder, u, s):
    """dot of unsigned bytes u with signed bytes s. u <= 128 and |s| <= 127 here, so the i16
    pair sums of vpmaddubsw (<= 32512) cannot saturate."""
    pairs = call(builder, "llvm.x86.avx2.pmadd.ub.sw", vec(_I16, 16), u, s)
    ones = ir.Constant(vec(_I16, 16), [1] * 16)
    return call(builder, "llvm.x86.avx2.pmadd.wd", vec(_I32, 8), pairs, ones)


def _dot_signed(builder, a, b, a_unsigned: bool):
    """Exact dot of weights a and activations b (|b| <= 127) as <8 x i32> partial sums,
    without VNNI. AVX2: multiply |a| by b carrying a's sign (vpsignb), as llama.cpp's
    mul_sum_i8_pairs; the `_1` formats' weights are already unsigned."""
    if DOT_PATH == "generic":
        return _dot_generic(builder, a, b)
    if a_unsigned:
        return _dot_u8s8(builder, a, b)
    abs_a = call(builder, "llvm.x86.avx2.psign.b", a.type, a, a)
    signed_b = call(builder, "llvm.x86.avx2.psign.b", b.type, b, a)
    return _dot_u8s8(builder, abs_a, signed_b)


@contextmanager
def _steps(builder, count):
    """A loop over range(count) of the steps after the 8-block ones; with those there is at
    most one of each kind (fewer than 8 blocks are left), so a branch instead: as loops,
    their accumulators' phis cost about 70 register moves per tile."""
    if not OCT_STEPS:
        with cgutils.for_range(builder, count) as loop:
            yield loop.index
        return
    with builder.if_then(builder.icmp_unsigned("!=", count, _I64(0))):
        yield _I64(0)


class _Tile:
    """Emits out[t0 + t, r0 + r] = dot(weight row r0 + r, token t0 + t) for an R x T tile.

    Per step of BLOCKS_PER_STEP blocks, each of the R weight blocks is decoded once for the
    T tokens and each token's activations are loaded once for the R rows; the R*T vector
    accumulators stay in registers for the whole row (R*T <= 16 of the 32 zmm registers).
    With VNNI the weights are unsigned (value + bias): dot(u, x) - bias*sum(x), the sum
    taken once per token and block by one more vpdpbusd against ones, and the correction
    seeded into the accumulator of the vpdpbusd itself; all exact integers."""

    def __init__(self, fmt: BlockFormat, rows: int, toks: int):
        self.fmt, self.rows, self.toks = fmt, rows, toks
        self.block_bytes, self.bias, self.max_u = fmt.block_bytes, fmt.bias, fmt.max_u
        self.has_min = fmt.has_min

    def _blocks(self, builder, w_row, i, n: int):
        """Pointers to blocks i .. i+n-1 of a weight row."""
        size = _I64(self.block_bytes)
        return [builder.gep(w_row, [builder.mul(builder.add(i, _I64(k)), size)]) for k in range(n)]

    @staticmethod
    def _scale_add(builder, acc, isum, d_w, d_x):
        """acc += float(isum) * d_w * d_x: the block sums, scaled, into an accumulator."""
        value = builder.sitofp(isum, d_w.type)
        _Tile._fma_into(builder, acc, value, builder.fmul(d_w, d_x))

    @staticmethod
    def _fma_into(builder, acc, a, b):
        """acc += a * b, lane by lane. A narrower product (the odd block's 8 lanes, added
        last) goes into its first lanes by a rounded product and an add, as into a zeroed
        accumulator of its own and then the sum, without 16 more accumulators to zero and
        add up in every tile."""
        total, n = builder.load(acc), a.type.count
        if total.type.count == n:
            total = fma(builder, a, b, total)
        else:
            part = builder.fmul(a, b)
            zeros = ir.Constant(part.type, [0.0] * n)
            total = builder.fadd(total, shuffle(builder, part, zeros, list(range(2 * n))))
        builder.store(total, acc)

    def _weights(self, builder, w_row, ahead, i, nb: int):
        """Step's blocks of one row: (u or signed <32nb x i8>, d <8nb x f32>)."""
        blks = self._blocks(builder, w_row, i, nb)
        prefetch(builder, builder.gep(blks[0], [ahead]))
        q = self.fmt.single(builder, blks[0])
        if nb == 2:
            q = shuffle(builder, q, self.fmt.single(builder, blks[1]), list(range(64)))
        if DOT_PATH != "vnni" and self.bias:  # sign trick path wants signed values
            q = builder.sub(q, splat(_I8, 32 * nb, self.bias))
        d = repeat_lanes(builder, [load_f16(builder, b, 0) for b in blks], 8)
        if DOT_PATH == "avx2" and self.toks > 1:  # opaque: else LLVM folds splat(d_w) *
            # splat(d_x) to a scalar product and a broadcast per row x token; one vector
            # product with d_x broadcast from memory is one ALU op fewer (the same f32
            # product: llama.cpp's exact results). One token has nothing to share: there the
            # opaque value cost Q8_0 matvecs 10-15%
            d = opaque(builder, d, "=x,0")
        return q, d

    def _dot(self, builder, q, x, corr):
        if DOT_PATH == "vnni":
            return _vpdpbusd(builder, corr, q, x)
        return _dot_signed(builder, q, x, a_unsigned=not self.bias)

    def step(self, builder, w_rows, ahead, toks, i, nb: int, accs):
        """Adds blocks i .. i+nb-1 of every (row, token) pair into its accumulators; with
        AVX-512 (the `_1` formats) their minimums' term too (_lane_mins)."""
        vi = vec(_I32, 8 * nb)
        lanes = [k for k in range(nb) for _ in range(8)]  # block of each lane
        weights = [self._weights(builder, w_row, ahead, i, nb) for w_row in w_rows]
        mins = ([self._lane_mins(builder, w_row, i, nb, 8) for w_row in w_rows]
                if self.has_min and OCT_STEPS else [])
        for t, (xq, xd, xs) in enumerate(toks):
            x = load(builder, xq, builder.mul(i, _I64(32)), vec(_I8, 32 * nb))
            d_x = load(builder, xd, builder.mul(i, _I64(4)), vec(_F32, nb))
            d_x = shuffle(builder, d_x, d_x, lanes)
            corr = ir.Constant(vi, [0] * 8 * nb)
            if DOT_PATH == "vnni" and self.bias:
                x_sum = _vpdpbusd(builder, corr, splat(_I8, 32 * nb, 1), x)
                corr = builder.mul(x_sum, ir.Constant(vi, [-self.bias] * 8 * nb))
            if mins:  # the blocks' sums d_x * sum(x), Q8_1's s
                s_x = load(builder, xs, builder.mul(i, _I64(4)), vec(_F32, nb))
                s_x = shuffle(builder, s_x, s_x, lanes)
            for r, (q, d_w) in enumerate(weights):
                isum = self._dot(builder, q, x, corr)
                self._scale_add(builder, accs[r][t], isum, d_w, d_x)
                if mins:
                    self._fma_into(builder, accs[r][t], mins[r], s_x)

    def _lane_mins(self, builder, w_row, i, nb: int, per_block: int):
        """m (the f16 at byte 2) of blocks i .. i+nb-1 as <per_block*nb x f32>: block k's in
        lane per_block*k, zero in the others, so that the accumulators' lanes, summed at the
        end, hold each block's m_w * s_x once."""
        vf = vec(_F32, per_block * nb)
        m = ir.Constant(vf, [0.0] * per_block * nb)
        for k, blk in enumerate(self._blocks(builder, w_row, i, nb)):
            m = builder.insert_element(m, load_f16(builder, blk, 2), _I32(per_block * k))
        return m

    def _quad_weights(self, builder, w_row, ahead, i):
        """Blocks i..i+3 of one row: (lo, hi) <64 x u8> and d <16 x f32> (d_k in lanes 4k..)."""
        blks = self._blocks(builder, w_row, i, 4)
        for line in range(0, 4 * self.block_bytes, 64):
            prefetch(builder, builder.gep(blks[0], [builder.add(ahead, _I64(line))]))
        lo, hi = self.fmt.quad(builder, blks)
        return lo, hi, repeat_lanes(builder, [load_f16(builder, b, 0) for b in blks], 4)

    def quad_step(self, builder, w_rows, ahead, toks, i, accs):
        """Adds blocks i..i+3 (AVX-512 VNNI). Lane group k (4 i32 lanes) of a product holds
        block i+k: a vpdpbusd on values 0..15 of the four blocks, then one on values 16..31
        into the same lanes, so each int->float conversion, scale product and FMA serves 128
        products where the two-block step's served 64 (5 vector ops per row x token and 128
        values instead of 8). The activations are regrouped to match by two 128-bit lane
        shuffles per token. The `_1` formats' minimums term m_w * s_x is one more FMA per row
        and token (m_w of block k in lane 4k, _lane_mins), as in the other steps."""
        vi, v64 = vec(_I32, 16), vec(_I8, 64)
        lanes = [k for k in range(4) for _ in range(4)]  # block of each lane
        weights = [self._quad_weights(builder, w_row, ahead, i) for w_row in w_rows]
        mins = ([self._lane_mins(builder, w_row, i, 4, 4) for w_row in w_rows]
                if self.has_min else [])
        zero = ir.Constant(vi, [0] * 16)
        for t, (xq, xd, xs) in enumerate(toks):
            x_a = load(builder, xq, builder.mul(i, _I64(32)), v64)
            x_b = load(builder, xq, builder.add(builder.mul(i, _I64(32)), _I64(64)), v64)
            x_lo, x_hi = halves(builder, x_a, x_b)
            d_x = load(builder, xd, builder.mul(i, _I64(4)), vec(_F32, 4))
            d_x = shuffle(builder, d_x, d_x, lanes)
            corr = zero
            if self.bias:
                ones = splat(_I8, 64, 1)
                x_sum = _vpdpbusd(builder, _vpdpbusd(builder, zero, ones, x_lo), ones, x_hi)
                corr = builder.mul(x_sum, ir.Constant(vi, [-self.bias] * 16))
            if mins:  # the blocks' sums d_x * sum(x), Q8_1's s
                s_x = load(builder, xs, builder.mul(i, _I64(4)), vec(_F32, 4))
                s_x = shuffle(builder, s_x, s_x, lanes)
            for r, (lo, hi, d_w) in enumerate(weights):
                isum = _vpdpbusd(builder, _vpdpbusd(builder, corr, lo, x_lo), hi, x_hi)
                self._scale_add(builder, accs[r][t], isum, d_w, d_x)
                if mins:
                    self._fma_into(builder, accs[r][t], mins[r], s_x)

    def _oct_weights(self, builder, w_row, ahead, i):
        """Blocks i..i+7 of one row for oct_step: (4 <64 x u8> registers, d <16 x f32>)."""
        blks = self._blocks(builder, w_row, i, 8)
        for line in range(0, 8 * self.block_bytes, 64):
            prefetch(builder, builder.gep(blks[0], [builder.add(ahead, _I64(line))]))
        # opaque: else LLVM multiplies d_w by d_x in 8 lanes and then copies the product
        # into the upper 8 (a port-5 shuffle per row and token)
        return self.fmt.oct(builder, blks), opaque(
            builder, oct_scales(builder, blks[0], self.block_bytes), "=v,0")

    def _oct_mins(self, builder, w_row, i):
        """m (the f16 at byte 2) of blocks i..i+7 as <16 x f32>: block b's in lane b, zero
        in lanes 8..15 (the oct step's accumulators hold block b in lanes b and b + 8)."""
        blk = builder.gep(w_row, [builder.mul(i, _I64(self.block_bytes))])
        m = half_to_f32(builder, block_words(builder, blk, self.block_bytes, 2, 1))
        zeros = ir.Constant(m.type, [0.0] * 8)
        return opaque(builder, shuffle(builder, m, zeros, list(range(16))), "=v,0")

    def oct_step(self, builder, w_rows, ahead, toks, i, accs):
        """Adds blocks i..i+7 (AVX-512 VNNI, grouped activations). Block b's 32 products sum
        into i32 lanes b and b + 8 by four vpdpbusd, so each conversion, scale product and
        FMA serves 256 products (7 vector ops per row x token and 256 values; the four-block
        step needs 10). The activations need no shuffles: the quantizer stored them in this
        order, and for the bias correction each lane's sum.

        Tokens outer (tiles of up to two rows, _tile_rows), so each token's 4 activation
        registers, bias correction and, for the `_1` formats, block sums are loaded once for
        both rows, whose 8 weight registers stay live beside the 16 accumulators. The `_1`
        formats' minimums term m_w * s_x of the 8 blocks is one more FMA per row and token,
        in lanes 0..7 (lanes 8..15 of m_w are zero)."""
        vi, v64 = vec(_I32, 16), vec(_I8, 64)

        def token(at, xq, xd, xs):
            """(activation registers, d_x, the bias correction) of one token."""
            x_at, d_at = builder.mul(at, _I64(32)), builder.mul(at, _I64(4))
            x = [load(builder, xq, builder.add(x_at, _I64(64 * k)), v64) for k in range(4)]
            d_x = load(builder, xd, d_at, vec(_F32, 8))
            corr = ir.Constant(vi, [0] * 16)
            if self.bias:  # the quantizer stored minus each lane's activation sum (GROUP_SUMS)
                sums = load(builder, xs, builder.mul(at, _I64(8)), vi)
                corr = builder.mul(sums, ir.Constant(vi, [self.bias] * 16))
            return x, shuffle(builder, d_x, d_x, list(range(8)) * 2), corr

        def add(acc, regs, d_w, x, d_x, corr):
            isum = corr
            for w, v in zip(regs, x):
                isum = _vpdpbusd(builder, isum, w, v)
            self._scale_add(builder, acc, isum, d_w, d_x)

        weights = [self._oct_weights(builder, w_row, ahead, i) for w_row in w_rows]
        mins = [self._oct_mins(builder, w_row, i) for w_row in w_rows] if self.has_min else []
        for t, tok in enumerate(toks):
            x, d_x, corr = token(i, *tok)
            if mins:  # the tokens' block sums d_x * sum(x), Q8_1's s
                s_x = load(builder, tok[2], builder.mul(i, _I64(4)), vec(_F32, 8))
                s_x = shuffle(builder, s_x, s_x, list(range(8)) * 2)
            for r, (regs, d_w) in enumerate(weights):
                add(accs[r][t], regs, d_w, x, d_x, corr)
                if mins:
                    self._fma_into(builder, accs[r][t], mins[r], s_x)

    def _rows_here(self, builder):
        """The tokens' activation rows, computed in the step from the first token's and the
        row strides (hidden from LLVM so that it does not hoist them): the 24 row pointers of
        8 tokens, kept across the block loop, spilled and came back as loads on the ports
        the activations need (Zen 3, 8-token Q4_1 and head products 2-3% faster)."""
        first, strides = self.firsts
        strides = [opaque(builder, st) for st in strides]
        return [[builder.gep(base, [builder.mul(_I64(t), st)]) for base, st in zip(first, strides)]
                for t in range(self.toks)]

    def ymm_step(self, builder, w_rows, ahead, toks, i, accs):
        """Adds blocks i..i+7 (AVX2: the `_1` formats, and the others' output head; grouped
        activations). Register j, lane b of weights and activations holds value dword
        YMM_DWORDS[j] of block b, so lane b of every product stays block b's. The unsigned
        weights (u <= 15) add 8 vpmaddubsw's i16 pair sums before one vpmaddwd (8 x 2 x 15 x
        127 < 2^15; 5-bit weights 4), so one conversion, scale product and FMA serve 256
        products where the one-block step's served 32: 19 vector ops per row x token for 8
        blocks instead of 40. Q4_0 / Q5_0 weights are biased (u = value + bias) and corrected
        by the block sums the quantizer stored; Q8_0 takes the sign trick, a vpmaddwd per
        register. The minimums' term m_w * s_x of the 8 blocks is one more FMA here (their
        lanes match), m_w from the same gather as d_w: Q4_1 products 5-11% faster at 8 tokens
        and 14-22% at one than with _add_mins (in one process, alternating). Rows outer,
        then registers, then tokens (_ymm_sums); the activations reloaded by each row."""
        vi = vec(_I32, 8)
        signed = self.max_u > 127  # Q8_0: llama.cpp's sign trick, a vpmaddwd per register
        per_sum = 1 if signed else 32767 // (2 * 127 * self.max_u)
        ones = ir.Constant(vec(_I16, 16), [1] * 16)
        if len(toks) > 1:
            toks = self._rows_here(builder)
        for r, w_row in enumerate(w_rows):
            blks = self._blocks(builder, w_row, i, 8)
            for line in range(0, 8 * self.block_bytes, 64):
                prefetch(builder, builder.gep(blks[0], [builder.add(ahead, _I64(line))]))
            regs = self.fmt.ymm(builder, blks)
            if signed:
                regs = [builder.sub(q, splat(_I8, 32, self.bias)) for q in regs]
            d_w, m_w = ymm_scales(builder, blks[0], self.block_bytes)
            at = opaque(builder, i)
            x_at, d_at = builder.mul(at, _I64(32)), builder.mul(at, _I64(4))
            isums = self._ymm_sums(builder, regs, toks, x_at, signed, per_sum, ones)
            for t, (xq, xd, xs) in enumerate(toks):
                isum = isums[t]
                if self.bias and not signed:  # the quantizer stored minus each block's sum
                    corr = load(builder, xs, d_at, vi)
                    isum = builder.add(isum, builder.mul(corr, ir.Constant(vi, [self.bias] * 8)))
                d_x = load(builder, xd, d_at, vec(_F32, 8))
                self._scale_add(builder, accs[r][t], isum, d_w, d_x)
                if self.has_min:  # the minimums' term, in place
                    s_x = load(builder, xs, d_at, vec(_F32, 8))
                    self._fma_into(builder, accs[r][t], m_w, s_x)

    @staticmethod
    def _ymm_sums(builder, regs, toks, x_at, signed: bool, per_sum: int, ones):
        """Each token's <8 x i32> integer sums of one row's 8 registers (ymm_step). Registers
        outer, tokens inner: one weight register (two with the sign trick) and a running sum
        per token are live, where all 8 (16) weight registers live across the tokens spilled
        with AVX2's 16 registers (Zen 3, one thread: 8-token Q8_0 head products 12-17%
        faster, Q4_1 9-14%)."""
        v32, vi = vec(_I8, 32), vec(_I32, 8)
        sums = [None] * len(toks)  # i32 sums so far
        pairs = [None] * len(toks)  # i16 pair sums of the current run of per_sum registers
        for j, q in enumerate(regs):
            for t, (xq, _, _) in enumerate(toks):
                x = load(builder, xq, builder.add(x_at, _I64(32 * j)), v32)
                if signed:
                    part = _dot_signed(builder, q, x, a_unsigned=False)
                else:
                    p = call(builder, "llvm.x86.avx2.pmadd.ub.sw", vec(_I16, 16), q, x)
                    pairs[t] = p if j % per_sum == 0 else builder.add(pairs[t], p)
                    if j % per_sum != per_sum - 1 and j != len(regs) - 1:
                        continue
                    part = call(builder, "llvm.x86.avx2.pmadd.wd", vi, pairs[t], ones)
                sums[t] = part if sums[t] is None else builder.add(sums[t], part)
            if j + 1 < len(regs):  # register j's work for every token before j + 1's
                if signed or j % per_sum == per_sum - 1:
                    sums = fence(builder, sums)
                else:
                    pairs = fence(builder, pairs)
        return sums

    def pair_step(self, builder, w_rows, ahead, toks, i, accs):
        """Adds blocks i, i+1 (AVX2, past the row's last 8-block group; actquant's pair
        order): i32 lanes 0-3 of a product are block i's, 4-7 block i+1's, so one
        conversion, scale product and FMA serve both blocks, and the `_1` formats' minimums
        are one more FMA (m_w in lanes 0 and 4 only). Where two one-block steps and a gather
        for the minimums took 3x an 8-block step's time per block (Zen 3, 576-wide Q4_1)."""
        vi = vec(_I32, 8)
        signed = self.bias != 0  # the pair decoders give signed values: the sign trick
        ones = ir.Constant(vec(_I16, 16), [1] * 16)
        halves_of = [k // 4 for k in range(8)]  # lane -> block of the pair
        for r, w_row in enumerate(w_rows):
            blks = self._blocks(builder, w_row, i, 2)
            for line in range(0, 2 * self.block_bytes, 64):
                prefetch(builder, builder.gep(blks[0], [builder.add(ahead, _I64(line))]))
            regs = self.fmt.pair(builder, blks)
            d_w = repeat_lanes(builder, [load_f16(builder, b, 0) for b in blks], 4)
            m_w = None
            if self.has_min:  # each block's minimum once: lanes 0 and 4
                m = repeat_lanes(builder, [load_f16(builder, b, 2) for b in blks], 4)
                m_w = shuffle(builder, m, ir.Constant(m.type, [0.0] * 8), [0, 8, 8, 8, 4, 8, 8, 8])
            at = opaque(builder, i)
            x_at, d_at = builder.mul(at, _I64(32)), builder.mul(at, _I64(4))
            for t, (xq, xd, xs) in enumerate(toks):
                x = [load(builder, xq, builder.add(x_at, _I64(32 * h)), vec(_I8, 32))
                     for h in range(2)]
                if signed:
                    isum = builder.add(*[_dot_signed(builder, q, v, a_unsigned=False)
                                         for q, v in zip(regs, x)])
                else:
                    pairs = [call(builder, "llvm.x86.avx2.pmadd.ub.sw", vec(_I16, 16), q, v)
                             for q, v in zip(regs, x)]
                    isum = call(builder, "llvm.x86.avx2.pmadd.wd", vi,
                                builder.add(*pairs), ones)
                d_x = load(builder, xd, d_at, vec(_F32, 2))
                self._scale_add(builder, accs[r][t], isum, d_w,
                                shuffle(builder, d_x, d_x, halves_of))
                if m_w is not None:
                    s_x = load(builder, xs, d_at, vec(_F32, 2))
                    self._fma_into(builder, accs[r][t], m_w,
                                   shuffle(builder, s_x, s_x, halves_of))

    def _add_mins(self, builder, w_rows, toks, start, n_blocks, accs):
        """The `_1` formats' sum over blocks of m_w * s_x (llama.cpp's `summs`) where the steps
        do not add it (AVX2 after its 8- and 2-block steps, NEON): into the tile's accumulators
        (their lanes are summed at the end) 8 blocks at a time from block `start`, each row's
        minimums gathered, each token's sums loaded, masked past the last block. In a loop of
        small steps it was a mostly-zero vector FMA plus the assembly of its operands in every
        step, about 30% of a decode step's instructions. With AVX-512 the steps add their own:
        the 8-block step over most of a row, the 4-, 2- and 1-block steps only at its end,
        where the loads and permutes of this pass for a few blocks had cost more (one thread,
        576-wide Q4_1 products 5% faster at 8 tokens, 11% at one; 384-wide 9-20%). Kept in
        separate sums instead, as llama.cpp adds summs after the rest, SmolLM2's golden logits
        moved further from llama.cpp's."""
        lanes = 8
        n_left = builder.sub(n_blocks, start)
        lane = ir.Constant(vec(_I64, lanes), list(range(lanes)))
        n_groups = builder.udiv(builder.add(n_left, _I64(lanes - 1)), _I64(lanes))
        with cgutils.for_range(builder, n_groups) as loop:
            first = builder.add(start, builder.mul(loop.index, _I64(lanes)))
            mask = builder.icmp_signed("<", lane, splat_value(  # blocks before the row's end
                builder, builder.sub(n_blocks, first), lanes))
            mins = [self._gathered_mins(builder, w_row, first, mask) for w_row in w_rows]
            self._fma_mins(builder, toks, first, mask, mins, accs)

    @staticmethod
    def _fma_mins(builder, toks, first, mask, mins, accs):
        """accs[r][t] += m_w of row r * s_x of token t, lane by lane, for the blocks from
        `first` (the tokens' sums loaded masked: 0 past the row's end)."""
        lanes = mask.type.count
        vf = vec(_F32, lanes)
        masked_load = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(vf, [vf.as_pointer(), _I32, vec(_I1, lanes), vf]),
            f"llvm.masked.load.v{lanes}f32.p0",
        )
        for t, (_, _, xs) in enumerate(toks):
            ptr = builder.bitcast(builder.gep(xs, [builder.mul(first, _I64(4))]),
                                  vf.as_pointer())
            s_x = builder.call(masked_load, [ptr, _I32(4), mask, ir.Constant(vf, [0.0] * lanes)])
            for r, m_w in enumerate(mins):
                _Tile._fma_into(builder, accs[r][t], m_w, s_x)

    def _gathered_mins(self, builder, w_row, first, mask):
        """Blocks first .. first + lanes - 1 by one gather, 0 where `mask` is off."""
        size = self.block_bytes
        blk0 = builder.gep(w_row, [builder.mul(first, _I64(size))])
        got = block_dwords(builder, blk0, size, 2, mask.type.count, mask)
        return half_to_f32(builder, builder.trunc(got, vec(_I16, mask.type.count)))

    def emit(self, context, builder, sig, args):
        w, xq, xd, xs, out = (
            Array2D(context, builder, sig.args[k], args[k]) for k in (3, 5, 6, 7, 9)
        )
        r0, t0 = args[4], args[8]
        w_rows = [w.row(builder.add(r0, _I64(r))) for r in range(self.rows)]
        # the same block, PREFETCH_TILES tiles of rows further on
        ahead = builder.mul(w.stride, _I64(PREFETCH_TILES * self.rows))
        toks = []
        for t in range(self.toks):
            tok = builder.add(t0, _I64(t))
            toks.append([xq.row(tok), xd.row(tok), xs.row(tok)])
        self.firsts = (toks[0], [xq.stride, xd.stride, xs.stride])
        # the weight row fixes n_in: activation buffers may be wider (shared scratch space)
        n_blocks = builder.udiv(w.n_cols, _I64(self.block_bytes))
        zero = ir.Constant(vec(_F32, 8 * BLOCKS_PER_STEP), [0.0] * 8 * BLOCKS_PER_STEP)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in toks] for _ in w_rows]
        step, done, mins_done = _I64(BLOCKS_PER_STEP), _I64(0), _I64(0)
        if OCT_STEPS:
            n_oct = builder.udiv(n_blocks, _I64(8))
            with cgutils.for_range(builder, n_oct) as loop:
                self.oct_step(builder, w_rows, ahead, toks, builder.mul(loop.index, _I64(8)),
                              accs)
            done = builder.mul(n_oct, _I64(8))
        if YMM_STEPS and self.fmt.ymm is not None:
            n_oct = builder.udiv(n_blocks, _I64(8))
            with cgutils.for_range(builder, n_oct) as loop:
                self.ymm_step(builder, w_rows, ahead, toks, builder.mul(loop.index, _I64(8)),
                              accs)
            done = builder.mul(n_oct, _I64(8))
            n_pair = builder.udiv(builder.sub(n_blocks, done), _I64(2))
            with cgutils.for_range(builder, n_pair) as loop:
                self.pair_step(builder, w_rows, ahead, toks,
                               builder.add(done, builder.mul(loop.index, _I64(2))), accs)
            done = mins_done = builder.add(done, builder.mul(n_pair, _I64(2)))
        if QUAD_STEPS:
            n_quad = builder.udiv(builder.sub(n_blocks, done), _I64(4))
            with _steps(builder, n_quad) as k:
                self.quad_step(builder, w_rows, ahead, toks,
                               builder.add(done, builder.mul(k, _I64(4))), accs)
            done = builder.add(done, builder.mul(n_quad, _I64(4)))
        left = builder.sub(n_blocks, done)
        with _steps(builder, builder.udiv(left, step)) as k:
            i = builder.add(done, builder.mul(k, step))
            self.step(builder, w_rows, ahead, toks, i, BLOCKS_PER_STEP, accs)
        if self.has_min and not OCT_STEPS:  # AVX-512: every step added its own
            self._add_mins(builder, w_rows, toks, mins_done, n_blocks, accs)
        if BLOCKS_PER_STEP == 2:  # an odd block count leaves one block, added last
            with builder.if_then(
                builder.icmp_unsigned("!=", builder.urem(n_blocks, step), _I64(0))
            ):
                self.step(builder, w_rows, ahead, toks, builder.sub(n_blocks, _I64(1)), 1, accs)
        # token by token, each token's rows side by side: one store of its `rows` adjacent
        # outputs out[t, r0:r0 + rows] (16 scalar stores and their lane extracts were 15% of
        # a 640-wide tile's time); every sum keeps its order (hsums)
        sums = hsums(builder, [builder.load(accs[r][t]) for t in range(self.toks)
                               for r in range(self.rows)])
        for t in range(self.toks):
            row = lanes_of(builder, sums, t * self.rows, self.rows)
            ptr = builder.gep(out.row(builder.add(t0, _I64(t))), [builder.mul(r0, _I64(4))])
            builder.store(row, builder.bitcast(ptr, row.type.as_pointer()), align=4)
        return context.get_dummy_value()


def _is_2d(ty, dtype) -> bool:
    return isinstance(ty, types.Array) and ty.ndim == 2 and ty.layout == "C" and ty.dtype == dtype


def _literal_int(ty) -> int:
    if not isinstance(ty, types.IntegerLiteral):
        raise TypingError("_tile needs compile-time constant format, rows and tokens")
    return ty.literal_value


# Prefetch distance: the same block in the rows PREFETCH_TILES tiles on, so every row a tile
# will read is in flight that many tiles earlier, whatever the row width. Counted in rows
# (4: a tile and a third of AVX-512's 3-row tiles), narrow rows were prefetched too late for
# DRAM; with 4 tiles, Q4_1 products at one token ran 3-7% faster at 576 wide and 19% at 640
# (a SmolLM2 decode step 5-7%), 8 tokens and AVX2's tiles within noise (alternating runs).
PREFETCH_TILES = 4



@intrinsic
def _tile(typingctx, code, rows, toks, w, r0, xq, xd, xs, t0, out):
    """(code, rows, toks, w, r0, xq, xd, xs, t0, out): writes out[t0:t0+toks, r0:r0+rows].
    code (a GGML type, plus LOGITS for a head kernel), rows and toks must be compile-time
    constants."""
    fmt, n_rows, n_toks = _block_format(_literal_int(code)), _literal_int(rows), _literal_int(toks)
    ok = (
        _is_2d(w, types.uint8)
        and _is_2d(xq, types.int8)
        and _is_2d(xd, types.float32)
        and _is_2d(xs, types.float32)
        and _is_2d(out, types.float32)
    )
    if not ok:
        raise TypingError("legacy kernels need C-contiguous 2-D arrays of the documented dtypes")
    emitter = _Tile(fmt, n_rows, n_toks)
    sig = types.none(code, rows, toks, w, types.intp, xq, xd, xs, types.intp, out)
    return sig, emitter.emit


# ---- kernels: one per type, made by one factory

# Register tile rows (x up to 8 tokens). With AVX-512's 32 zmm registers: 2 rows, their
# 8-block step tokens outer, so that each token's activations and bias correction are loaded
# once for both (_Tile.oct_step): against 3 rows, rows outer, 8-token Q8_0, Q5_0 and Q4_0
# products 20-45% faster, 64 tokens 15-40% (hot weights, alternating). The `_1` formats too,
# since their minimums are one more FMA in the oct step (not added per tile after the block
# loop, whose cost per tile had made 2 rows 10% slower than 3 rows outer at 576 wide): Zen 5,
# one thread, 8-token Q4_1 products 8% (1536 x 576) to 20% (576 x 1536) faster, 4 tokens 8%,
# one token the same; SmolLM2 pp512 +25-31%, 8-sequence decode steps ~3% (alternating). AVX2 and
# NEON have 16 vector registers (NEON needs 2 per accumulator): 2 rows, but 1 with AVX2's
# 8-block step, whose 8 weight registers leave no room for 16 accumulators (8-token
# products 20-40% faster than with 2 rows).
_WIDE_TILES = BLOCKS_PER_STEP == 2


def _tile_rows(code: int) -> int:
    """Register tile rows of a kernel code."""
    if _WIDE_TILES:
        return 2
    return 1 if YMM_STEPS and _block_format(code).ymm is not None else 2


ROWS_PER_CHUNK = 16  # output rows per chunk, rounded up to whole tiles: stays in L1
# Products of up to 8 tokens (decode, batched decode) reuse a chunk's weights for at most one
# token tile, so they keep nothing in L1 and take chunks twice as long: fewer chunk starts and
# counter updates. Zen 4, 2 threads, cold weights, in one process, alternating: SmolLM2's
# 8-token Q4_1 products 2-7% faster and its Q8_0 head 3-7%, one token 0-4%; 64 tokens lost 4-8%
# with 32 rows (a 1536-wide chunk no longer fits L1 beside the activations).
DECODE_ROWS_PER_CHUNK = 32
# Below this many weight bytes x tokens a matmul runs on one thread: fork/join of the second
# costs a few us, more than it saves on a small matrix (a 64 KB matvec takes ~8 us).
SERIAL_WORK = 64 * 1024


@njit(cache=True, nogil=True)
def _chunk_tokens(code, n_rows, n_toks, w, xq, xd, xs, out, r0, r1) -> None:
    """Rows [r0, r1) x all tokens in tiles of n_rows x n_toks; a last partial tile is moved
    back to overlap the previous one (recomputing a few identical outputs)."""
    literally(code)
    literally(n_rows)
    literally(n_toks)
    n_tok = out.shape[0]
    for t in range(0, n_tok, n_toks):
        t = min(t, n_tok - n_toks)
        for r in range(r0, r1, n_rows):
            _tile(code, n_rows, n_toks, w, min(r, r1 - n_rows), xq, xd, xs, t, out)


@njit(cache=True, nogil=True)
def _chunk_rows(rows, n_tok):
    per_chunk = DECODE_ROWS_PER_CHUNK if n_tok <= 8 else ROWS_PER_CHUNK
    return (per_chunk + rows - 1) // rows * rows


@njit(cache=True, nogil=True)
def _chunk(code, rows, w, xq, xd, xs, out, c) -> None:
    """Output rows of chunk c for every token, in tiles of `rows` rows x 8 tokens (prefill,
    batches of 8+), else 4, 2 or 1, so a weight block is decoded once for as many tokens as
    possible."""
    literally(code)
    literally(rows)
    n_tok, n_out = out.shape
    chunk_rows = _chunk_rows(rows, n_tok)
    r0 = c * chunk_rows
    r1 = n_out if r0 + 2 * chunk_rows > n_out else r0 + chunk_rows
    if r1 - r0 < rows:  # fewer rows than a tile
        _chunk_tokens(code, 1, 1, w, xq, xd, xs, out, r0, r1)
    elif n_tok >= 8:
        _chunk_tokens(code, rows, 8, w, xq, xd, xs, out, r0, r1)
    elif n_tok >= 4:
        _chunk_tokens(code, rows, 4, w, xq, xd, xs, out, r0, r1)
    elif n_tok >= 2:
        _chunk_tokens(code, rows, 2, w, xq, xd, xs, out, r0, r1)
    else:
        _chunk_tokens(code, rows, 1, w, xq, xd, xs, out, r0, r1)


def _make_matmul(qtype: T, logits: bool = False):
    """The kernel for one type (logits: its output-head variant). Its closure holds only the
    ints `code` and `rows` (numba's on-disk cache pickles closure cells; a pickled dispatcher
    or intrinsic differs between processes)."""
    code = int(qtype) | (LOGITS if logits else 0)
    rows = _tile_rows(code)

    def matmul(w, xq, xd, xs, xf, out) -> None:  # xf unused: uniform kernel signature
        n_tok, n_out = out.shape
        n_chunks = max(n_out // _chunk_rows(rows, n_tok), 1)
        if w.shape[1] * n_out * n_tok < SERIAL_WORK:  # no fork/join for a small product
            for c in range(n_chunks):
                _chunk(code, rows, w, xq, xd, xs, out, np.int64(c))
        else:  # each thread its own rows, then helps the others (schedule.py)
            counters, n_seg = chunk_counters(), n_workers(n_chunks)
            for task in prange(n_seg):
                c, k = next_chunk(counters, np.int64(task), np.int64(0), n_chunks, n_seg)
                while c >= 0:
                    _chunk(code, rows, w, xq, xd, xs, out, c)
                    c, k = next_chunk(counters, np.int64(task), k, n_chunks, n_seg)

    name = f"matmul_{qtype.name.lower()}" + ("_logits" if logits else "")
    matmul.__name__ = matmul.__qualname__ = name
    return njit(parallel=True, cache=True, nogil=True)(matmul)


matmul_q8_0 = _make_matmul(T.Q8_0)
matmul_q4_0 = _make_matmul(T.Q4_0)
matmul_q4_1 = _make_matmul(T.Q4_1)
matmul_q5_0 = _make_matmul(T.Q5_0)
matmul_q5_1 = _make_matmul(T.Q5_1)
# the output head's kernels, where they differ (AVX2): the 8-block step on grouped activations
LOGITS_KERNELS = {
    qtype: (Q8_0_GROUPED_ACT, _make_matmul(qtype, logits=True))
    for qtype in (T.Q8_0, T.Q4_0, T.Q5_0) if YMM_STEPS
}


register(T.Q8_0, Q8_0_ACT, matmul_q8_0, LOGITS_KERNELS.get(T.Q8_0))
register(T.Q4_0, Q8_0_ACT, matmul_q4_0, LOGITS_KERNELS.get(T.Q4_0))
register(T.Q4_1, Q8_1_ACT, matmul_q4_1)
register(T.Q5_0, Q8_0_ACT, matmul_q5_0, LOGITS_KERNELS.get(T.Q5_0))
register(T.Q5_1, Q8_1_ACT, matmul_q5_1)
