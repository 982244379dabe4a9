"""Matrix-product kernels for the legacy GGML types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1.

Each kernel has the registry's uniform signature `kernel(w, xq, xd, xs, xf, out)` and writes
out[t, r] = dot(w[r], x[t]) for every token t and output row r.

Integer types follow llama.cpp's `ggml_vec_dot_*_q8_*` (ggml-cpu/arch/x86/quants.c): per
32-value block an exact integer dot product into 8 int32 lanes, converted to f32 and
accumulated with one FMA by d_w*d_x into an f32 vector accumulator that lives across blocks;
the `_1` types add sum(m_w * s_x) separately. The block loop is hand-written LLVM vector IR
(`numba.extending.intrinsic`): LLVM's auto-vectorizers were fragile on nibble formats
(kernels.md, facts 1-6). The integer dot is chosen once from the CPU numba targets
(DOT_PATH): `vpdpbusd` (AVX-VNNI / AVX512-VNNI) on unsigned weights (value + bias, the bias
times the activations' block sum subtracted exactly), with AVX-512 four blocks per step of
the block loop, two vpdpbusd into the same lanes (_Tile.quad_step); else `vpmaddubsw` +
`vpmaddwd` (AVX2) with llama.cpp's sign trick; else portable IR (NEON,
NUMBA_CPU_NAME=generic). The integer sums are exact on every path.

Float types accumulate in f32 like ggml_vec_dot_f16/bf16/f32 on x86; 'reassoc' lets LLVM
split the sum across SIMD lanes as ggml does, 'contract' lets it use FMA.

Tiling: one intrinsic call computes a register tile of 2 or 3 rows (TILE_ROWS) x 8 tokens
(prefill, batches of 8+; smaller batches 4, 2 or 1): each weight block is decoded once per 8
tokens, each activation block loaded once per tile's rows, and the 16 or 24 accumulators stay
in registers for the whole row; at the end all of a tile's accumulators are summed across
their lanes together (_hsums). Parallelism: `prange` over chunks of about ROWS_PER_CHUNK
rows, whose weights stay in L1 while the tokens stream past; products under SERIAL_WORK run
on the calling thread.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba import literally, njit, prange, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from edgeinfer.kernels.actquant import (
    BF16_ACT,
    F16_ACT,
    F32_ACT,
    Q8_0_ACT,
    Q8_1_ACT,
)
from edgeinfer.kernels.f16 import half_to_f32
from edgeinfer.kernels.registry import register
from edgeinfer.kernels.target import CPU_FEATURES

_I1, _I8, _I16, _I32, _I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
_F32 = ir.FloatType()
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


def _load_f16(builder, base, offset):
    return half_to_f32(builder, _load(builder, base, offset, _I16))


# ---- weight block decoders: (builder, block ptr) -> <32 x u8> = weight value + BIAS[format]
# (unsigned, so that VNNI's u8 x s8 product needs no sign trick), element j = value j


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


def _decode_q8_0(builder, blk):  # d f16 | qs int8[32]; u = q + 128 (flip the sign bit)
    return builder.xor(_load(builder, blk, 2, _vec(_I8, 32)), _splat(_I8, 32, 0x80))


def _decode_q4_0(builder, blk):  # d f16 | qs u8[16]; value = nibble - 8
    return _nibbles(builder, blk, 2)


def _decode_q4_1(builder, blk):  # d f16 | m f16 | qs u8[16]; value = d * nibble + m
    return _nibbles(builder, blk, 4)


def _decode_q5_0(builder, blk):  # d f16 | qh u32 | qs u8[16]; value = (nibble | hbit<<4) - 16
    return builder.or_(_nibbles(builder, blk, 6), _high_bits(builder, blk, 2))


def _decode_q5_1(builder, blk):  # d f16 | m f16 | qh u32 | qs u8[16]
    return builder.or_(_nibbles(builder, blk, 8), _high_bits(builder, blk, 4))


# ---- quad decoders: (builder, 4 block ptrs) -> (lo, hi) <64 x u8>, values + BIAS[format]:
# lo holds values 0..15 of each block in turn, hi values 16..31 (see _Tile.quad_step)


def _concat(builder, parts):
    """Equal-width vectors end to end."""
    while len(parts) > 1:
        n = parts[0].type.count
        pairs = zip(parts[::2], parts[1::2])
        parts = [_shuffle(builder, a, b, list(range(2 * n))) for a, b in pairs]
    return parts[0]


def _quad_nibbles(builder, blks, offset):
    """A nibble block's low nibbles are its values 0..15, its high nibbles 16..31."""
    qs = _concat(builder, [_load(builder, blk, offset, _vec(_I8, 16)) for blk in blks])
    return builder.and_(qs, _splat(_I8, 64, 0x0F)), builder.lshr(qs, _splat(_I8, 64, 4))


def _quad_high_bits(builder, blks, offset):
    """The 5th bits (qh: bit j for value j) as 16 or 0 in the (lo, hi) layout."""
    halves = []
    for shift in (0, 16):
        mask = _I64(0)
        for k, blk in enumerate(blks):
            half = builder.and_(builder.lshr(_load(builder, blk, offset, _I32), _I32(shift)),
                                _I32(0xFFFF))
            mask = builder.or_(mask, builder.shl(builder.zext(half, _I64), _I64(16 * k)))
        bits = builder.bitcast(mask, _vec(_I1, 64))
        halves.append(builder.select(bits, _splat(_I8, 64, 16), _splat(_I8, 64, 0)))
    return halves


def _halves(builder, a, b):
    """Two <64 x i8> holding four 32-byte blocks end to end -> (first 16 bytes of each block,
    last 16 bytes of each): two 128-bit lane shuffles (vshufi64x2)."""

    def units(picks):
        return [16 * u + k for u in picks for k in range(16)]

    first, last = units([0, 2, 4, 6]), units([1, 3, 5, 7])
    return _shuffle(builder, a, b, first), _shuffle(builder, a, b, last)


def _quad_q8_0(builder, blks):
    flip = _splat(_I8, 64, 0x80)
    qs = [_load(builder, blk, 2, _vec(_I8, 32)) for blk in blks]
    pairs = _concat(builder, qs[:2]), _concat(builder, qs[2:])
    return tuple(builder.xor(h, flip) for h in _halves(builder, *pairs))


def _quad_q4_0(builder, blks):
    return _quad_nibbles(builder, blks, 2)


def _quad_q4_1(builder, blks):
    return _quad_nibbles(builder, blks, 4)


def _quad_q5_0(builder, blks):
    nib, hb = _quad_nibbles(builder, blks, 6), _quad_high_bits(builder, blks, 2)
    return tuple(builder.or_(a, b) for a, b in zip(nib, hb))


def _quad_q5_1(builder, blks):
    nib, hb = _quad_nibbles(builder, blks, 8), _quad_high_bits(builder, blks, 4)
    return tuple(builder.or_(a, b) for a, b in zip(nib, hb))


# ---- the block dot product


if "avxvnni" in CPU_FEATURES or {"avx512vnni", "avx512vl"} <= CPU_FEATURES:
    DOT_PATH = "vnni"  # vpdpbusd: 32 u8*s8 products summed into 8 i32 in one instruction
elif "avx2" in CPU_FEATURES:
    DOT_PATH = "avx2"  # vpmaddubsw + vpmaddwd, llama.cpp's AVX2 path
else:
    DOT_PATH = "generic"  # portable IR; LLVM picks widening multiplies (NEON smull/sdot...)

# Blocks per step of the block loop: with AVX-512 VNNI two 32-value blocks share one zmm
# register, which halves the int->float conversions, scale products and FMAs per block.
BLOCKS_PER_STEP = 2 if DOT_PATH == "vnni" and {"avx512vnni", "avx512bw"} <= CPU_FEATURES else 1
# ... and four blocks per step in the main loop (_Tile.quad_step), two vpdpbusd per lane.
QUAD_STEPS = BLOCKS_PER_STEP == 2


def _call(builder, name: str, ret: ir.Type, *args):
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ret, [a.type for a in args]), name
    )
    return builder.call(fn, args)


def _fma(builder, a, b, c):
    """a * b + c, lane-wise, one rounding."""
    return _call(builder, f"llvm.fma.v{a.type.count}f32", a.type, a, b, c)


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


def _vpdpbusd(builder, acc, u, s):
    """acc + sums of 4 adjacent u8*s8 products, exact in i32 (no saturation): 8 or 16 lanes."""
    n = acc.type.count
    vi = _vec(_I32, n)
    name = "llvm.x86.avx512.vpdpbusd.512" if n == 16 else "llvm.x86.avx512.vpdpbusd.256"
    return _call(builder, name, vi, acc, builder.bitcast(u, vi), builder.bitcast(s, vi))


def _dot_u8s8(builder, u, s):
    """dot of unsigned bytes u with signed bytes s. u <= 128 and |s| <= 127 here, so the i16
    pair sums of vpmaddubsw (<= 32512) cannot saturate."""
    pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", _vec(_I16, 16), u, s)
    ones = ir.Constant(_vec(_I16, 16), [1] * 16)
    return _call(builder, "llvm.x86.avx2.pmadd.wd", _vec(_I32, 8), pairs, ones)


def _dot_signed(builder, a, b, a_unsigned: bool):
    """Exact dot of weights a and activations b (|b| <= 127) as <8 x i32> partial sums,
    without VNNI. AVX2: multiply |a| by b carrying a's sign (vpsignb), as llama.cpp's
    mul_sum_i8_pairs; the `_1` formats' weights are already unsigned."""
    if DOT_PATH == "generic":
        return _dot_generic(builder, a, b)
    if a_unsigned:
        return _dot_u8s8(builder, a, b)
    abs_a = _call(builder, "llvm.x86.avx2.psign.b", a.type, a, a)
    signed_b = _call(builder, "llvm.x86.avx2.psign.b", b.type, b, a)
    return _dot_u8s8(builder, abs_a, signed_b)


def _hsums(builder, vecs):
    """Horizontal sums of equal-width <2^k x float> vectors (a tile's accumulators), each in
    one order: lane j plus lane j + half, halves down to one lane (hsum_float_8's order on 8
    lanes). All vectors at once: two of them, each holding segments of w partial sums, become
    one with twice the segments of w/2 (two shuffles and one add for a whole vector of lanes,
    where reducing each vector alone costs about three operations per halving)."""
    lanes = vecs[0].type.count
    zero = ir.Constant(vecs[0].type, [0.0] * lanes)
    segs, width = 1, lanes
    while width > 1:
        half = width // 2
        firsts = [s * width + k for s in range(segs) for k in range(half)]
        if len(vecs) > 1:
            pairs = zip(vecs[::2], vecs[1::2] if len(vecs) % 2 == 0 else vecs[1::2] + [zero])
            vecs = [
                builder.fadd(
                    _shuffle(builder, a, b, firsts + [lanes + i for i in firsts]),
                    _shuffle(builder, a, b, [i + half for i in firsts]
                             + [lanes + i + half for i in firsts]),
                )
                for a, b in pairs
            ]
            segs *= 2
        else:  # one vector left: halve its length
            v = vecs[0]
            vecs = [builder.fadd(_shuffle(builder, v, v, firsts),
                                 _shuffle(builder, v, v, [i + half for i in firsts]))]
        width = half
    return [builder.extract_element(v, _I32(k)) for v in vecs for k in range(segs)]


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


class _Array2D:
    """i8* to row i of a C-contiguous 2-D array argument (any row stride)."""

    def __init__(self, context, builder, arrty, arr):
        ary = context.make_array(arrty)(context, builder, arr)
        self.builder = builder
        self.base = builder.bitcast(ary.data, _I8.as_pointer())
        self.stride = cgutils.unpack_tuple(builder, ary.strides, 2)[0]
        self.n_cols = cgutils.unpack_tuple(builder, ary.shape, 2)[1]

    def row(self, i):
        return self.builder.gep(self.base, [self.builder.mul(i, self.stride)])


def _splat_value(builder, value, n: int):
    """A runtime scalar in all n lanes."""
    v = builder.insert_element(ir.Constant(_vec(value.type, n), None), value, _I32(0))
    return _shuffle(builder, v, v, [0] * n)


def _repeat_lanes(builder, values, n: int):
    """[v0 x n, v1 x n, ...] from scalar f32 values."""
    v = ir.Constant(_vec(_F32, len(values)), None)
    for k, value in enumerate(values):
        v = builder.insert_element(v, value, _I32(k))
    return _shuffle(builder, v, v, [k for k in range(len(values)) for _ in range(n)])


class _Tile:
    """Emits out[t0 + t, r0 + r] = dot(weight row r0 + r, token t0 + t) for an R x T tile.

    Per step of BLOCKS_PER_STEP blocks, each of the R weight blocks is decoded once for the
    T tokens and each token's activations are loaded once for the R rows; the R*T vector
    accumulators stay in registers for the whole row (R*T <= 24 of the 32 zmm registers).
    With VNNI the weights are unsigned (value + bias): dot(u, x) - bias*sum(x), the sum
    taken once per token and block by one more vpdpbusd against ones, and the correction
    seeded into the accumulator of the vpdpbusd itself; all exact integers."""

    def __init__(self, decode, quad, block_bytes: int, bias: int, has_min: bool, rows: int,
                 toks: int):
        self.decode, self.quad, self.block_bytes = decode, quad, block_bytes
        self.bias, self.has_min, self.rows, self.toks = bias, has_min, rows, toks

    def _blocks(self, builder, w_row, i, n: int):
        """Pointers to blocks i .. i+n-1 of a weight row."""
        size = _I64(self.block_bytes)
        return [builder.gep(w_row, [builder.mul(builder.add(i, _I64(k)), size)]) for k in range(n)]

    @staticmethod
    def _scale_add(builder, acc, isum, d_w, d_x):
        """acc += float(isum) * d_w * d_x: the block sums, scaled, into an accumulator."""
        value = builder.sitofp(isum, d_w.type)
        total = _fma(builder, value, builder.fmul(d_w, d_x), builder.load(acc))
        builder.store(total, acc)

    def _weights(self, builder, w_row, ahead, i, nb: int):
        """Step's blocks of one row: (u or signed <32nb x i8>, d <8nb x f32>)."""
        blks = self._blocks(builder, w_row, i, nb)
        _prefetch(builder, builder.gep(blks[0], [ahead]))
        q = self.decode(builder, blks[0])
        if nb == 2:
            q = _shuffle(builder, q, self.decode(builder, blks[1]), list(range(64)))
        if DOT_PATH != "vnni" and self.bias:  # sign trick path wants signed values
            q = builder.sub(q, _splat(_I8, 32 * nb, self.bias))
        d = _repeat_lanes(builder, [_load_f16(builder, b, 0) for b in blks], 8)
        return q, d

    def _dot(self, builder, q, x, corr):
        if DOT_PATH == "vnni":
            return _vpdpbusd(builder, corr, q, x)
        return _dot_signed(builder, q, x, a_unsigned=not self.bias)

    def step(self, builder, w_rows, ahead, toks, i, nb: int, accs):
        """Adds blocks i .. i+nb-1 of every (row, token) pair into its accumulators."""
        vi = _vec(_I32, 8 * nb)
        weights = [self._weights(builder, w_row, ahead, i, nb) for w_row in w_rows]
        for t, (xq, xd, xs) in enumerate(toks):
            x = _load(builder, xq, builder.mul(i, _I64(32)), _vec(_I8, 32 * nb))
            d_x = _load(builder, xd, builder.mul(i, _I64(4)), _vec(_F32, nb))
            d_x = _shuffle(builder, d_x, d_x, [k for k in range(nb) for _ in range(8)])
            corr = ir.Constant(vi, [0] * 8 * nb)
            if DOT_PATH == "vnni" and self.bias:
                x_sum = _vpdpbusd(builder, corr, _splat(_I8, 32 * nb, 1), x)
                corr = builder.mul(x_sum, ir.Constant(vi, [-self.bias] * 8 * nb))
            for r, (q, d_w) in enumerate(weights):
                isum = self._dot(builder, q, x, corr)
                self._scale_add(builder, accs[nb][r][t], isum, d_w, d_x)

    def _quad_weights(self, builder, w_row, ahead, i):
        """Blocks i..i+3 of one row: (lo, hi) <64 x u8> and d <16 x f32> (d_k in lanes 4k..)."""
        blks = self._blocks(builder, w_row, i, 4)
        for line in range(0, 4 * self.block_bytes, 64):
            _prefetch(builder, builder.gep(blks[0], [builder.add(ahead, _I64(line))]))
        lo, hi = self.quad(builder, blks)
        return lo, hi, _repeat_lanes(builder, [_load_f16(builder, b, 0) for b in blks], 4)

    def quad_step(self, builder, w_rows, ahead, toks, i, accs):
        """Adds blocks i..i+3 (AVX-512 VNNI). Lane group k (4 i32 lanes) of a product holds
        block i+k: a vpdpbusd on values 0..15 of the four blocks, then one on values 16..31
        into the same lanes, so each int->float conversion, scale product and FMA serves 128
        products where the two-block step's served 64 (5 vector ops per row x token and 128
        values instead of 8). The activations are regrouped to match by two 128-bit lane
        shuffles per token."""
        vi, v64 = _vec(_I32, 16), _vec(_I8, 64)
        weights = [self._quad_weights(builder, w_row, ahead, i) for w_row in w_rows]
        zero = ir.Constant(vi, [0] * 16)
        for t, (xq, xd, _) in enumerate(toks):
            x_a = _load(builder, xq, builder.mul(i, _I64(32)), v64)
            x_b = _load(builder, xq, builder.add(builder.mul(i, _I64(32)), _I64(64)), v64)
            x_lo, x_hi = _halves(builder, x_a, x_b)
            d_x = _load(builder, xd, builder.mul(i, _I64(4)), _vec(_F32, 4))
            d_x = _shuffle(builder, d_x, d_x, [k for k in range(4) for _ in range(4)])
            corr = zero
            if self.bias:
                ones = _splat(_I8, 64, 1)
                x_sum = _vpdpbusd(builder, _vpdpbusd(builder, zero, ones, x_lo), ones, x_hi)
                corr = builder.mul(x_sum, ir.Constant(vi, [-self.bias] * 16))
            for r, (lo, hi, d_w) in enumerate(weights):
                isum = _vpdpbusd(builder, _vpdpbusd(builder, corr, lo, x_lo), hi, x_hi)
                self._scale_add(builder, accs[r][t], isum, d_w, d_x)

    def _add_mins(self, builder, w_rows, toks, n_blocks, accs):
        """The `_1` formats' sum over blocks of m_w * s_x (llama.cpp's `summs`), added into
        the tile's accumulators (their lanes are summed at the end) W = 8 * BLOCKS_PER_STEP
        blocks at a time: each row's minimums gathered from its blocks (vpgatherdd), each
        token's sums loaded, masked past the last block. Done in the block loop, it was a
        mostly-zero vector FMA plus the assembly of its operands in every step, about 30% of
        a decode step's instructions (a 4096-wide Q4_1 matvec is 20% faster without). Kept
        in separate sums instead, as llama.cpp adds summs after the rest, SmolLM2's golden
        logits moved further from llama.cpp's."""
        lanes = 8 * BLOCKS_PER_STEP
        vf, vi = _vec(_F32, lanes), _vec(_I64, lanes)
        ptrs, words = _vec(_I32.as_pointer(), lanes), _vec(_I32, lanes)
        gather = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(words, [ptrs, _I32, _vec(_I1, lanes), words]),
            f"llvm.masked.gather.v{lanes}i32.v{lanes}p0",
        )
        load = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(vf, [vf.as_pointer(), _I32, _vec(_I1, lanes), vf]),
            f"llvm.masked.load.v{lanes}f32.p0",
        )
        n_groups = builder.udiv(builder.add(n_blocks, _I64(lanes - 1)), _I64(lanes))
        lane = ir.Constant(vi, list(range(lanes)))
        strides = ir.Constant(vi, [k * self.block_bytes for k in range(lanes)])
        zero_words, zero_f = ir.Constant(words, [0] * lanes), ir.Constant(vf, [0.0] * lanes)
        with cgutils.for_range(builder, n_groups) as loop:
            first = builder.mul(loop.index, _I64(lanes))
            left = _splat_value(builder, builder.sub(n_blocks, first), lanes)
            mask = builder.icmp_signed("<", lane, left)
            offset = builder.add(builder.mul(first, _I64(self.block_bytes)), _I64(2))
            mins = []
            for w_row in w_rows:  # m of block b: the f16 at byte 2 (a dword load covers it)
                start = builder.add(builder.ptrtoint(w_row, _I64), offset)
                addr = builder.add(_splat_value(builder, start, lanes), strides)
                got = builder.call(gather, [builder.inttoptr(addr, ptrs), _I32(2), mask,
                                            zero_words])
                mins.append(half_to_f32(builder, builder.trunc(got, _vec(_I16, lanes))))
            for t, (_, _, xs) in enumerate(toks):
                ptr = builder.gep(xs, [builder.mul(first, _I64(4))])
                s_x = builder.call(load, [builder.bitcast(ptr, vf.as_pointer()), _I32(4), mask,
                                          zero_f])
                for r, m_w in enumerate(mins):
                    acc = accs[r][t]
                    builder.store(_fma(builder, m_w, s_x, builder.load(acc)), acc)

    def emit(self, context, builder, sig, args):
        w, xq, xd, xs, out = (
            _Array2D(context, builder, sig.args[k], args[k]) for k in (3, 5, 6, 7, 9)
        )
        r0, t0 = args[4], args[8]
        w_rows = [w.row(builder.add(r0, _I64(r))) for r in range(self.rows)]
        ahead = builder.mul(w.stride, _I64(PREFETCH_ROWS))  # same block, rows further on
        toks = []
        for t in range(self.toks):
            tok = builder.add(t0, _I64(t))
            toks.append([xq.row(tok), xd.row(tok), xs.row(tok)])
        # the weight row fixes n_in: activation buffers may be wider (shared scratch space)
        n_blocks = builder.udiv(w.n_cols, _I64(self.block_bytes))
        widths = sorted({1, BLOCKS_PER_STEP})
        accs = {}
        for nb in widths:
            zero = ir.Constant(_vec(_F32, 8 * nb), [0.0] * 8 * nb)
            accs[nb] = [[cgutils.alloca_once_value(builder, zero) for _ in toks] for _ in w_rows]
        step, done = _I64(BLOCKS_PER_STEP), _I64(0)
        if QUAD_STEPS:
            done = builder.mul(builder.udiv(n_blocks, _I64(4)), _I64(4))
            with cgutils.for_range(builder, builder.udiv(n_blocks, _I64(4))) as loop:
                i = builder.mul(loop.index, _I64(4))
                self.quad_step(builder, w_rows, ahead, toks, i, accs[2])
        left = builder.sub(n_blocks, done)
        with cgutils.for_range(builder, builder.udiv(left, step)) as loop:
            i = builder.add(done, builder.mul(loop.index, step))
            self.step(builder, w_rows, ahead, toks, i, BLOCKS_PER_STEP, accs)
        if BLOCKS_PER_STEP == 2:  # an odd block count leaves one block
            with builder.if_then(
                builder.icmp_unsigned("!=", builder.urem(n_blocks, step), _I64(0))
            ):
                self.step(builder, w_rows, ahead, toks, builder.sub(n_blocks, _I64(1)), 1, accs)
        if self.has_min:
            self._add_mins(builder, w_rows, toks, n_blocks, accs[BLOCKS_PER_STEP])
        totals = []
        for r in range(self.rows):
            for t in range(self.toks):
                total = builder.load(accs[widths[-1]][r][t])
                if len(widths) == 2:  # the odd block's 8 lanes into the first 8
                    odd = builder.load(accs[1][r][t])
                    zeros = ir.Constant(odd.type, [0.0] * 8)
                    total = builder.fadd(total, _shuffle(builder, odd, zeros, list(range(16))))
                totals.append(total)
        for k, total in enumerate(_hsums(builder, totals)[: self.rows * self.toks]):
            r, t = divmod(k, self.toks)
            ptr = builder.gep(
                out.row(builder.add(t0, _I64(t))),
                [builder.mul(builder.add(r0, _I64(r)), _I64(4))],
            )
            builder.store(total, builder.bitcast(ptr, _F32.as_pointer()))
        return context.get_dummy_value()


def _is_2d(ty, dtype) -> bool:
    return isinstance(ty, types.Array) and ty.ndim == 2 and ty.layout == "C" and ty.dtype == dtype


def _literal_int(ty) -> int:
    if not isinstance(ty, types.IntegerLiteral):
        raise TypingError("_tile needs compile-time constant format, rows and tokens")
    return ty.literal_value


# Prefetch distance: the same block PREFETCH_ROWS rows on (the next tiles' rows), so every
# row a tile will read is in flight a tile or two earlier, whatever the row width.
PREFETCH_ROWS = 4

# format code -> (decoder, quad decoder, block bytes, bias added by the decoders, has a
# minimum: the `_1` formats, on Q8_1 activations)
_FORMATS = {
    int(T.Q8_0): (_decode_q8_0, _quad_q8_0, 34, 128, False),
    int(T.Q4_0): (_decode_q4_0, _quad_q4_0, 18, 8, False),
    int(T.Q4_1): (_decode_q4_1, _quad_q4_1, 20, 0, True),
    int(T.Q5_0): (_decode_q5_0, _quad_q5_0, 22, 16, False),
    int(T.Q5_1): (_decode_q5_1, _quad_q5_1, 24, 0, True),
}


@intrinsic
def _tile(typingctx, code, rows, toks, w, r0, xq, xd, xs, t0, out):
    """(code, rows, toks, w, r0, xq, xd, xs, t0, out): writes out[t0:t0+toks, r0:r0+rows].
    code (a GGML type), rows and toks must be compile-time constants."""
    fmt, n_rows, n_toks = _FORMATS[_literal_int(code)], _literal_int(rows), _literal_int(toks)
    ok = (
        _is_2d(w, types.uint8)
        and _is_2d(xq, types.int8)
        and _is_2d(xd, types.float32)
        and _is_2d(xs, types.float32)
        and _is_2d(out, types.float32)
    )
    if not ok:
        raise TypingError("legacy kernels need C-contiguous 2-D arrays of the documented dtypes")
    emitter = _Tile(*fmt, n_rows, n_toks)
    sig = types.none(code, rows, toks, w, types.intp, xq, xd, xs, types.intp, out)
    return sig, emitter.emit


# ---- kernels: one per type, made by one factory

# Register tile rows (x up to 8 tokens). With AVX-512's 32 zmm registers, 3 rows (24
# accumulators) amortize each token's activation load and bias correction over more rows:
# prefill GFLOP/s +38% for Q5_0, +22% for Q8_0. The `_1` formats too, since their minimums
# are added after the block loop (_Tile._add_mins): SmolLM2 8-sequence decode +7-10%, pp512
# +8-18% (with the minimums in the loop, 3 rows were 9% slower). AVX2 and NEON have 16
# vector registers (NEON needs 2 per accumulator): 2 rows everywhere.
_WIDE_TILES = BLOCKS_PER_STEP == 2
TILE_ROWS = dict.fromkeys(_FORMATS, 3 if _WIDE_TILES else 2)
ROWS_PER_CHUNK = 16  # output rows per prange task, rounded up to whole tiles: stays in L1
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
def _chunk_rows(rows):
    return (ROWS_PER_CHUNK + rows - 1) // rows * rows


@njit(cache=True, nogil=True)
def _chunk(code, rows, w, xq, xd, xs, out, c) -> None:
    """Output rows of chunk c for every token, in tiles of `rows` rows x 8 tokens (prefill,
    batches of 8+), else 4, 2 or 1, so a weight block is decoded once for as many tokens as
    possible."""
    literally(code)
    literally(rows)
    n_tok, n_out = out.shape
    chunk_rows = _chunk_rows(rows)
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


def _make_matmul(qtype: T):
    """The kernel for one type. Its closure holds only the int `code` (numba's on-disk cache
    pickles closure cells; a pickled dispatcher or intrinsic differs between processes)."""
    code, rows = int(qtype), TILE_ROWS[int(qtype)]

    def matmul(w, xq, xd, xs, xf, out) -> None:  # xf unused: uniform kernel signature
        n_tok, n_out = out.shape
        n_chunks = max(n_out // _chunk_rows(rows), 1)
        if w.shape[1] * n_out * n_tok < SERIAL_WORK:  # no fork/join for a small product
            for c in range(n_chunks):
                _chunk(code, rows, w, xq, xd, xs, out, np.int64(c))
        else:
            for c in prange(n_chunks):  # int64 c in both loops: one compiled _chunk
                _chunk(code, rows, w, xq, xd, xs, out, np.int64(c))

    matmul.__name__ = matmul.__qualname__ = f"matmul_{qtype.name.lower()}"
    return njit(parallel=True, cache=True, nogil=True)(matmul)


matmul_q8_0 = _make_matmul(T.Q8_0)
matmul_q4_0 = _make_matmul(T.Q4_0)
matmul_q4_1 = _make_matmul(T.Q4_1)
matmul_q5_0 = _make_matmul(T.Q5_0)
matmul_q5_1 = _make_matmul(T.Q5_1)


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
            return half_to_f32(builder, value)
        return builder.bitcast(builder.shl(builder.zext(value, _I32), _I32(16)), _F32)

    return types.float32(v), codegen


FLOAT_ROWS_PER_CHUNK = 16  # output rows per prange task of the float kernel
_FLOAT_MATH = {"reassoc", "contract"}  # lane-split sums and FMA, as ggml's SIMD dot products


@njit(parallel=True, cache=True, nogil=True, fastmath=_FLOAT_MATH)
def matmul_float(w, xq, xd, xs, xf, out) -> None:
    """F32 (float32 w) weights; F16 and BF16 come through matmul_f16 / matmul_bf16."""
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
        for t in range(n_quad * 4, n_tok):
            for r in range(c * FLOAT_ROWS_PER_CHUNK, r_end):
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
