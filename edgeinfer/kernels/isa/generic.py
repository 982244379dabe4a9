"""Portable integer dot products (no x86 intrinsics): plain widening multiplies and adds,
which LLVM lowers to what the target has (NEON smull/sdot, SSE). Also the interface every
ISA module implements; isa/__init__.py documents it."""

from __future__ import annotations

from llvmlite import ir

from edgeinfer.kernels.ir import permute, vec

NAME = "generic"
_I16, _I32, _I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)

# ---- integer products


def u8s8_pairs(builder, u, s):
    """<32 x u8> * <32 x s8> -> <16 x i16> sums of adjacent products (callers keep them
    below 2^15, so they agree with vpmaddubsw's saturating ones)."""
    p = builder.mul(builder.zext(u, vec(_I16, 32)), builder.sext(s, vec(_I16, 32)))
    return builder.add(permute(builder, p, list(range(0, 32, 2))),
                       permute(builder, p, list(range(1, 32, 2))))


def i16_pairs(builder, p, s):
    """<16 x i16> * <16 x i16> -> <8 x i32> sums of adjacent products."""
    q = builder.mul(builder.sext(p, vec(_I32, 16)), builder.sext(s, vec(_I32, 16)))
    return builder.add(permute(builder, q, list(range(0, 16, 2))),
                       permute(builder, q, list(range(1, 16, 2))))


def i16_pairs_add(builder, acc, p, s):
    """acc + i16_pairs(p, s); acc None: the products alone."""
    part = i16_pairs(builder, p, s)
    return part if acc is None else builder.add(acc, part)


def i8_dot(builder, a, b, a_unsigned: bool):
    """Exact dot of 32 weight bytes a and activations b as <8 x i32> partial sums, lane k
    the products 4k .. 4k+3 as on every other path (AVX2's vpmaddubsw + vpmaddwd, VNNI,
    sdot), so the float sums after it are the same bits: i16 products (|a b| <= 16384),
    adjacent pairs added in i16 (<= 32512), then pairs of pairs in i32. NEON: smull and
    pairwise adds. Unsigned weights are below 128 here."""
    p = builder.mul(builder.sext(a, vec(_I16, 32)), builder.sext(b, vec(_I16, 32)))
    pairs = builder.add(permute(builder, p, list(range(0, 32, 2))),
                        permute(builder, p, list(range(1, 32, 2))))  # <16 x i16>
    q = builder.sext(pairs, vec(_I32, 16))
    return builder.add(permute(builder, q, list(range(0, 16, 2))),
                       permute(builder, q, list(range(1, 16, 2))))


scaled_dot = None  # acc + sum of scale * u * x over 32 values in one product (dotprod.py);
# None: kquants takes u8s8_pairs, then i16_pairs_add with the scales


# ---- the legacy kernels' block loop (legacy._Tile)

BLOCKS_PER_STEP = 1  # blocks of the block loop's last step kind
BIASED_WEIGHTS = False  # the block dot takes weights as decoded (value + bias)
STEPS_ADD_MINS = False  # the steps add the `_1` formats' minimums term themselves
ONE_TAIL_STEP = False  # at most one last step is left after the wide steps
HEAD_KERNELS = False  # the output head gets kernels of its own (code + LOGITS)


def block_dot(builder, q, x, corr, unsigned: bool):
    """The exact <8*nb x i32> dot of a step's weight bytes q with activations x; corr is
    the bias correction (zeros here: the weights were made signed)."""
    return i8_dot(builder, q, x, unsigned)


def bias_correction(builder, x, bias: int, lanes: int):
    """The term that undoes the decoders' bias in block_dot: none here."""
    return ir.Constant(vec(_I32, lanes), [0] * lanes)


def step_scales(builder, d, toks: int):
    """The weight scales of a step as the products with the activations' take them."""
    return d


def tile_rows(fmt) -> int:
    """Register tile rows of a block format."""
    return 2


def wide_steps(tile, builder, w_rows, ahead, toks, n_blocks, accs):
    """The multi-block steps over the start of a row: (blocks done, blocks whose minimums
    are added). None here."""
    return _I64(0), _I64(0)


# ---- the k-quant kernels

superblock_sums_zmm = None  # a super-block's sums two chunks per instruction: none here
