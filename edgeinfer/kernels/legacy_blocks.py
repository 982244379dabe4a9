"""Weight-block decoders of the legacy kernels (legacy.py) as LLVM IR, in four layouts.

Each builds, from the raw GGML blocks of one weight row, unsigned bytes u = value + BIAS of
the format (bias 0 for the `_1` formats, whose values are already unsigned nibbles), so that
VNNI's u8 x s8 product needs no sign trick:

| decoder | blocks | result                                                                  |
|---------|--------|-------------------------------------------------------------------------|
| single  | 1      | <32 x u8>, element j = value j                                          |
| quad    | 4      | (lo, hi) <64 x u8>: values 0..15 of each block in turn, then 16..31     |
| oct     | 8      | four <64 x u8> in actquant's grouped order (register k, i32 lane l:     |
|         |        | value dword GROUP_DWORDS[k][l // 8] of block l % 8)                     |
| ymm     | 8      | the same as eight <32 x u8> (AVX2: register j, lane b: value dword      |
|         |        | YMM_DWORDS[j] of block b; the `_1` formats, and the others' head)       |
| pair    | 2      | two <32 x i8>: values 0..15 of blocks A, B, then 16..31 (AVX2, the      |
|         |        | blocks past a row's last 8-block group; signed values where BIAS > 0)   |

Layouts: Q8_0 d f16 | qs i8[32]; Q4_0 d | qs u8[16]; Q4_1 d | m f16 | qs; Q5_0 d | qh u32 |
qs; Q5_1 d | m | qh | qs. A nibble format's low nibbles are values 0..15, high 16..31; qh bit
j is the 5th bit of value j.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba.core import cgutils

from edgeinfer.kernels.actquant import GROUP_DWORDS
from edgeinfer.kernels.f16 import half_to_f32
from edgeinfer.kernels.ir import concat, load, shuffle, splat, splat_value, vec
from edgeinfer.kernels.target import CPU_FEATURES

_I1, _I8, _I16, _I32, _I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))


# ---- weight block decoders: (builder, block ptr) -> <32 x u8> = weight value + BIAS[format]
# (unsigned, so that VNNI's u8 x s8 product needs no sign trick), element j = value j


def _nibbles(builder, base, offset):
    """16 bytes -> <32 x i8>: low nibbles are values 0..15, high nibbles values 16..31."""
    qs = load(builder, base, offset, vec(_I8, 16))
    lo = builder.and_(qs, splat(_I8, 16, 0x0F))
    hi = builder.lshr(qs, splat(_I8, 16, 4))
    return shuffle(builder, lo, hi, list(range(32)))


def _high_bits(builder, base, offset):
    """uint32 qh -> <32 x i8> holding 16 where bit j of qh is set (the 5th bit of value j):
    byte j // 8 of qh in lane j, tested against bit j % 8 (a byte shuffle and a bit test on
    any SIMD: 244 instructions per 256 Q5_0 weights on AArch64 with dotprod, 716 from a
    32-lane bit mask of the scalar, which only AVX-512 holds in a mask register)."""
    if "avx512bw" in CPU_FEATURES:  # one kmov into a mask register
        bits = builder.bitcast(load(builder, base, offset, _I32), vec(_I1, 32))
        return builder.select(bits, splat(_I8, 32, 16), splat(_I8, 32, 0))
    qh = load(builder, base, offset, vec(_I8, 4))
    spread = shuffle(builder, qh, qh, [j // 8 for j in range(32)])  # <32 x i8>
    bit = ir.Constant(vec(_I8, 32), [1 << (j % 8) for j in range(32)])
    is_set = builder.icmp_unsigned("!=", builder.and_(spread, bit), splat(_I8, 32, 0))
    return builder.select(is_set, splat(_I8, 32, 16), splat(_I8, 32, 0))


def _decode_q8_0(builder, blk):  # d f16 | qs int8[32]; u = q + 128 (flip the sign bit)
    return builder.xor(load(builder, blk, 2, vec(_I8, 32)), splat(_I8, 32, 0x80))


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




def _quad_nibbles(builder, blks, offset):
    """A nibble block's low nibbles are its values 0..15, its high nibbles 16..31."""
    qs = concat(builder, [load(builder, blk, offset, vec(_I8, 16)) for blk in blks])
    return builder.and_(qs, splat(_I8, 64, 0x0F)), builder.lshr(qs, splat(_I8, 64, 4))


def _quad_high_bits(builder, blks, offset):
    """The 5th bits (qh: bit j for value j) as 16 or 0 in the (lo, hi) layout."""
    halves = []
    for shift in (0, 16):
        mask = _I64(0)
        for k, blk in enumerate(blks):
            half = builder.and_(builder.lshr(load(builder, blk, offset, _I32), _I32(shift)),
                                _I32(0xFFFF))
            mask = builder.or_(mask, builder.shl(builder.zext(half, _I64), _I64(16 * k)))
        bits = builder.bitcast(mask, vec(_I1, 64))
        halves.append(builder.select(bits, splat(_I8, 64, 16), splat(_I8, 64, 0)))
    return halves


def halves(builder, a, b):
    """Two <64 x i8> holding four 32-byte blocks end to end -> (first 16 bytes of each block,
    last 16 bytes of each): two 128-bit lane shuffles (vshufi64x2)."""

    def units(picks):
        return [16 * u + k for u in picks for k in range(16)]

    first, last = units([0, 2, 4, 6]), units([1, 3, 5, 7])
    return shuffle(builder, a, b, first), shuffle(builder, a, b, last)


def _quad_q8_0(builder, blks):
    flip = splat(_I8, 64, 0x80)
    qs = [load(builder, blk, 2, vec(_I8, 32)) for blk in blks]
    pairs = concat(builder, qs[:2]), concat(builder, qs[2:])
    return tuple(builder.xor(h, flip) for h in halves(builder, *pairs))


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


# ---- oct decoders: (builder, 8 block ptrs) -> four <64 x u8>, values + BIAS[format], in the
# grouped activation order (actquant.GROUP_DWORDS): register k, i32 lane l holds value dword
# GROUP_DWORDS[k][l // 8] (values 4m..4m+3) of block l % 8 (see _Tile.oct_step)


def _oct_pick(builder, blks, offset, n_words, k):
    """Register k's 16 dwords from n_words dwords at `offset` of each of 8 blocks."""
    def words(part):
        return concat(builder, [load(builder, b, offset, vec(_I32, n_words)) for b in part])

    idx = [n_words * (lane % 8) + GROUP_DWORDS[k][lane // 8] % n_words for lane in range(16)]
    return shuffle(builder, words(blks[:4]), words(blks[4:]), idx)


def _oct_nibbles(builder, blks, offset):
    """Value dword m < 4 is the low nibbles of qs dword m, m >= 4 the high nibbles of m - 4:
    registers 0, 2 and 1, 3 share their qs dwords."""
    v64, low = vec(_I8, 64), splat(_I8, 64, 0x0F)
    qs = [builder.bitcast(_oct_pick(builder, blks, offset, 4, k), v64) for k in (0, 1)]
    return [builder.and_(q, low) for q in qs] + [_high_nibbles(builder, q) for q in qs]


def _high_nibbles(builder, q):
    """q >> 4 per byte, as a 16-bit shift and a mask: LLVM's byte shift (vgf2p8affineqb)
    competes with vpdpbusd for its ports on some cores, the shift and the `and` do not
    (docs/performance.md, Kernels)."""
    v16 = vec(_I16, q.type.count // 2)
    shifted = builder.bitcast(builder.lshr(builder.bitcast(q, v16), splat(_I16, v16.count, 4)),
                              q.type)
    return builder.and_(shifted, splat(_I8, q.type.count, 0x0F))


def block_dwords(builder, blk0, block_bytes: int, offset: int, lanes: int = 8, mask=None):
    """The dword at `offset` of `lanes` consecutive blocks from blk0: <lanes x i32>, by one
    gather (inserts would keep port 5 busy); lanes off in `mask` read nothing and give 0."""
    ptrs, words = vec(_I32.as_pointer(), lanes), vec(_I32, lanes)
    gather = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(words, [ptrs, _I32, vec(_I1, lanes), words]),
        f"llvm.masked.gather.v{lanes}i32.v{lanes}p0",
    )
    start = splat_value(builder, builder.add(builder.ptrtoint(blk0, _I64), _I64(offset)), lanes)
    offsets = ir.Constant(vec(_I64, lanes), [k * block_bytes for k in range(lanes)])
    addrs = builder.inttoptr(builder.add(start, offsets), ptrs)
    if mask is None:
        mask = ir.Constant(vec(_I1, lanes), [1] * lanes)
    return builder.call(gather, [addrs, _I32(2), mask, ir.Constant(words, [0] * lanes)])


def block_words(builder, blk0, block_bytes: int, offset: int, n_words: int):
    """The n_words 16-bit words at `offset` of 8 consecutive blocks from blk0, block by
    block: <8 n_words x i16>, by 64-byte loads inside the 8 blocks and word permutes
    (vpermt2w, AVX-512 BW). A gather does the same in one instruction, but some cores
    microcode it, which made it slower (docs/performance.md, Kernels).
    Every block size is even, so every word sits at an even offset of some load."""
    span, n = 8 * block_bytes, 8 * n_words
    starts = [*range(0, span - 63, 64)]
    if starts[-1] + 64 < span:
        starts.append(span - 64)  # the last load ends at the 8 blocks' end, not past it
    picks = []  # (load, word in it) of each output word
    for b in range(8):
        for k in range(n_words):
            at = b * block_bytes + offset + 2 * k
            j = next(j for j, s in enumerate(starts) if s <= at <= s + 62)
            picks.append((j, (at - starts[j]) // 2))
    v32 = vec(_I16, 32)
    loads = {j: load(builder, blk0, starts[j], v32) for j, _ in picks}
    parts = []
    for pair in range(0, max(loads) + 1, 2):  # loads 2p, 2p + 1 -> one permute
        a, b = loads.get(pair), loads.get(pair + 1)
        if a is None and b is None:
            continue
        idx = [w + 32 * (j - pair) if j in (pair, pair + 1) else 0 for j, w in picks]
        a, b = (a if a is not None else b), (b if b is not None else a)
        parts.append((pair, shuffle(builder, a, b, idx)))
    _, words = parts[0]
    for pair, part in parts[1:]:  # take the words this pair holds
        idx = [n + i if j in (pair, pair + 1) else i for i, (j, _) in enumerate(picks)]
        words = shuffle(builder, words, part, idx)
    return words


def _bit_select(builder, words, bits):
    """vpshufbitqmb (BITALG): byte j of the mask = bit bits[j] of qword j // 8 of words."""
    v64, mask = vec(_I8, 64), vec(_I1, 64)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(mask, [v64, v64]), "llvm.x86.avx512.vpshufbitqmb.512"
    )
    return builder.call(fn, [builder.bitcast(words, v64), ir.Constant(v64, bits)])


def _oct_high_bits(builder, blk0, block_bytes: int, offset: int):
    """The 5th bits (qh: bit j for value j) as 16 or 0 in the four registers. Lane l takes
    qh of block l % 8; value dword m's bits are qh bits 4m..4m+3. With BITALG one
    vpshufbitqmb per register picks each byte's bit (from the qword of lanes 2q, 2q + 1);
    else a shift per lane, a byte spread and a test."""
    qh = builder.bitcast(block_words(builder, blk0, block_bytes, offset, 2), vec(_I32, 8))
    qh = shuffle(builder, qh, qh, list(range(8)) * 2)
    sixteen, zero = splat(_I8, 64, 16), splat(_I8, 64, 0)
    regs = []
    for dwords in GROUP_DWORDS:
        if "avx512bitalg" in CPU_FEATURES:
            bits = [32 * (lane % 2) + 4 * dwords[lane // 8] + i for lane in range(16)
                    for i in range(4)]
            is_set = _bit_select(builder, qh, bits)
        else:
            shifts = ir.Constant(vec(_I32, 16), [4 * dwords[lane // 8] for lane in range(16)])
            low = builder.bitcast(builder.lshr(qh, shifts), vec(_I8, 64))
            spread = shuffle(builder, low, low, [j // 4 * 4 for j in range(64)])
            bit = builder.and_(spread, ir.Constant(vec(_I8, 64), [1, 2, 4, 8] * 16))
            is_set = builder.icmp_unsigned("!=", bit, zero)
        regs.append(builder.select(is_set, sixteen, zero))
    return regs


def oct_scales(builder, blk0, block_bytes: int):
    """d (the f16 at byte 0) of 8 blocks as <16 x f32>: block b's in lanes b and b + 8."""
    d = half_to_f32(builder, block_words(builder, blk0, block_bytes, 0, 1))
    return shuffle(builder, d, d, list(range(8)) * 2)


def _oct_q8_0(builder, blks):
    flip = splat(_I8, 64, 0x80)
    return [builder.xor(builder.bitcast(_oct_pick(builder, blks, 2, 8, k), flip.type), flip)
            for k in range(4)]


def _oct_q4_0(builder, blks):
    return _oct_nibbles(builder, blks, 2)


def _oct_q4_1(builder, blks):
    return _oct_nibbles(builder, blks, 4)


def _oct_q5_0(builder, blks):
    nib, hb = _oct_nibbles(builder, blks, 6), _oct_high_bits(builder, blks[0], 22, 2)
    return [builder.or_(a, b) for a, b in zip(nib, hb)]


def _oct_q5_1(builder, blks):
    nib, hb = _oct_nibbles(builder, blks, 8), _oct_high_bits(builder, blks[0], 24, 4)
    return [builder.or_(a, b) for a, b in zip(nib, hb)]


# ---- AVX2 oct decoders (the `_1` formats' kernels, and the other formats' output-head
# kernels): (builder, 8 block ptrs) -> eight <32 x u8>, the grouped order read 32 bytes at a
# time: register j, i32 lane b holds value dword YMM_DWORDS[j] of block b (_Tile.ymm_step)

YMM_DWORDS = tuple(m for pair in GROUP_DWORDS for m in pair)


def _dword_columns(builder, blks, offset):
    """Dwords 0..3 at `offset` of 8 blocks -> four <8 x i32>, register m lane b = dword m of
    block b: blocks b and b + 4 share a register's 128-bit halves, then a 4 x 4 transpose in
    each half by unpacks."""
    v4 = vec(_I32, 4)
    rows = [shuffle(builder, load(builder, blks[b], offset, v4),
                    load(builder, blks[b + 4], offset, v4), list(range(8))) for b in range(4)]
    lo_dq, hi_dq = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    lo_qdq, hi_qdq = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    t0, t1 = (shuffle(builder, rows[0], rows[1], idx) for idx in (lo_dq, hi_dq))
    t2, t3 = (shuffle(builder, rows[2], rows[3], idx) for idx in (lo_dq, hi_dq))
    return [shuffle(builder, a, b, idx)
            for a, b in ((t0, t2), (t1, t3)) for idx in (lo_qdq, hi_qdq)]


def _ymm_nibbles(builder, blks, offset):
    """Value dword m < 4: the low nibbles of qs dword m; m >= 4: the high nibbles of m - 4."""
    v32 = vec(_I8, 32)
    cols = [builder.bitcast(c, v32) for c in _dword_columns(builder, blks, offset)]
    values = [builder.and_(c, splat(_I8, 32, 0x0F)) for c in cols]
    values += [builder.lshr(c, splat(_I8, 32, 4)) for c in cols]
    return [values[m] for m in YMM_DWORDS]


def _ymm_high_bits(builder, blk0, block_bytes: int, offset: int):
    """The 5th bits (qh: bit j for value j) as 16 or 0 in the eight registers: value dword
    m's bits are qh bits 4m..4m+3, one shift for all lanes, spread to bytes and tested."""
    qh = block_dwords(builder, blk0, block_bytes, offset)
    regs = []
    for m in YMM_DWORDS:
        low = builder.bitcast(builder.lshr(qh, splat(_I32, 8, 4 * m)), vec(_I8, 32))
        spread = shuffle(builder, low, low, [j // 4 * 4 for j in range(32)])
        bit = builder.and_(spread, ir.Constant(vec(_I8, 32), [1, 2, 4, 8] * 8))
        is_set = builder.icmp_unsigned("!=", bit, splat(_I8, 32, 0))
        regs.append(builder.select(is_set, splat(_I8, 32, 16), splat(_I8, 32, 0)))
    return regs


def ymm_scales(builder, blk0, block_bytes: int):
    """(d, m) of 8 `_1` blocks (the f16s at bytes 0 and 2) as two <8 x f32>, from one
    gather of their first dwords."""
    dm = block_dwords(builder, blk0, block_bytes, 0)
    d = half_to_f32(builder, builder.trunc(dm, vec(_I16, 8)))
    m = half_to_f32(builder, builder.trunc(builder.lshr(dm, splat(_I32, 8, 16)), vec(_I16, 8)))
    return d, m


def _ymm_q8_0(builder, blks):
    v32, flip = vec(_I8, 32), splat(_I8, 32, 0x80)
    cols = _dword_columns(builder, blks, 2) + _dword_columns(builder, blks, 18)
    return [builder.xor(builder.bitcast(cols[m], v32), flip) for m in YMM_DWORDS]


def _ymm_q4_0(builder, blks):
    return _ymm_nibbles(builder, blks, 2)


def _ymm_q4_1(builder, blks):
    return _ymm_nibbles(builder, blks, 4)


def _ymm_q5_0(builder, blks):
    nib, hb = _ymm_nibbles(builder, blks, 6), _ymm_high_bits(builder, blks[0], 22, 2)
    return [builder.or_(a, b) for a, b in zip(nib, hb)]


def _ymm_q5_1(builder, blks):
    nib, hb = _ymm_nibbles(builder, blks, 8), _ymm_high_bits(builder, blks[0], 24, 4)
    return [builder.or_(a, b) for a, b in zip(nib, hb)]


# ---- AVX2 pair decoders (the same kernels as the ymm ones, for the blocks past a row's last
# whole group of 8): (builder, 2 block ptrs) -> two <32 x i8>, register h holding values
# 16h..16h+15 of block A in its low 16 bytes and of block B in its high 16 (actquant's pair
# order), so that i32 lanes 0-3 of a product are A's and 4-7 B's. Values are the weights
# themselves, signed where the format has a bias (the sign trick multiplies them), unsigned
# nibbles for the `_1` formats.


def _pair_bytes(builder, blks, offset):
    """16 bytes at `offset` of blocks A and B: <32 x i8> [A's | B's]."""
    v16 = vec(_I8, 16)
    return shuffle(builder, load(builder, blks[0], offset, v16),
                   load(builder, blks[1], offset, v16), list(range(32)))


def _pair_nibbles(builder, blks, offset):
    qs = _pair_bytes(builder, blks, offset)
    return [builder.and_(qs, splat(_I8, 32, 0x0F)), builder.lshr(qs, splat(_I8, 32, 4))]


def _pair_high_bits(builder, blks, offset):
    """The 5th bits (qh bit j for value j) as 16 or 0 in the two pair registers."""
    v4 = vec(_I8, 4)
    qh = shuffle(builder, load(builder, blks[0], offset, v4), load(builder, blks[1], offset, v4),
                 list(range(8)))
    regs = []
    for half in (0, 1):  # values 0..15, then 16..31
        values = [16 * half + k % 16 for k in range(32)]
        spread = shuffle(builder, qh, qh, [4 * (k // 16) + v // 8 for k, v in enumerate(values)])
        bit = builder.and_(spread, ir.Constant(vec(_I8, 32), [1 << (v % 8) for v in values]))
        is_set = builder.icmp_unsigned("!=", bit, splat(_I8, 32, 0))
        regs.append(builder.select(is_set, splat(_I8, 32, 16), splat(_I8, 32, 0)))
    return regs


def _biased(builder, regs, bias: int):
    return [builder.sub(q, splat(_I8, 32, bias)) for q in regs]


def _pair_q8_0(builder, blks):
    return [_pair_bytes(builder, blks, 2), _pair_bytes(builder, blks, 18)]


def _pair_q4_0(builder, blks):
    return _biased(builder, _pair_nibbles(builder, blks, 2), 8)


def _pair_q4_1(builder, blks):
    return _pair_nibbles(builder, blks, 4)


def _pair_q5_0(builder, blks):
    nib, hb = _pair_nibbles(builder, blks, 6), _pair_high_bits(builder, blks, 2)
    return _biased(builder, [builder.or_(a, b) for a, b in zip(nib, hb)], 16)


def _pair_q5_1(builder, blks):
    nib, hb = _pair_nibbles(builder, blks, 8), _pair_high_bits(builder, blks, 4)
    return [builder.or_(a, b) for a, b in zip(nib, hb)]




class BlockFormat(NamedTuple):
    """One legacy type's block decoders (the layouts of the table above) and constants."""

    single: Callable  # (builder, block ptr) -> <32 x u8>
    quad: Callable  # (builder, 4 block ptrs) -> (lo, hi) <64 x u8>
    oct: Callable  # (builder, 8 block ptrs) -> four <64 x u8>, grouped order
    ymm: Callable | None  # (builder, 8 block ptrs) -> eight <32 x u8>; None: not used
    pair: Callable | None  # (builder, 2 block ptrs) -> two <32 x i8>; None: not used
    block_bytes: int
    bias: int  # added to every value by the decoders (single, quad, oct, ymm)
    max_u: int  # largest decoded byte
    has_min: bool  # the `_1` formats (d * q + m), which multiply Q8_1 activations


BLOCK_FORMATS = {  # GGML type code -> its BlockFormat
    int(T.Q8_0): BlockFormat(_decode_q8_0, _quad_q8_0, _oct_q8_0, _ymm_q8_0, _pair_q8_0,
                             block_bytes=34, bias=128, max_u=255, has_min=False),
    int(T.Q4_0): BlockFormat(_decode_q4_0, _quad_q4_0, _oct_q4_0, _ymm_q4_0, _pair_q4_0,
                             block_bytes=18, bias=8, max_u=15, has_min=False),
    int(T.Q4_1): BlockFormat(_decode_q4_1, _quad_q4_1, _oct_q4_1, _ymm_q4_1, _pair_q4_1,
                             block_bytes=20, bias=0, max_u=15, has_min=True),
    int(T.Q5_0): BlockFormat(_decode_q5_0, _quad_q5_0, _oct_q5_0, _ymm_q5_0, _pair_q5_0,
                             block_bytes=22, bias=16, max_u=31, has_min=False),
    int(T.Q5_1): BlockFormat(_decode_q5_1, _quad_q5_1, _oct_q5_1, _ymm_q5_1, _pair_q5_1,
                             block_bytes=24, bias=0, max_u=31, has_min=True),
}
