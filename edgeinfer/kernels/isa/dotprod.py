"""AArch64 dot-product extension (sdot: Apple M1 and later, Neoverse N1 / Graviton2 and
later, Cortex-A76 and later, so the Raspberry Pi 5): 16 i8 x i8 products into 4 i32 lanes,
each lane the sum of 4 consecutive products, in one instruction.

Two sdot on a block's two 16-byte halves give lane k = products 4k .. 4k+3 of the block's 32
and lane 4 + k = products 16 + 4k .. 16 + 4k+3: the lanes of every other path (vpmaddubsw +
vpmaddwd, vpdpbusd, generic.py's pair sums). The rest of the interface is generic.py's (one
legacy block per step), so the logits are the same bits as the portable path's, on ARM or
x86 (docs/architecture.md, "AArch64", says why not llama.cpp's ARM order).
"""

from __future__ import annotations

from llvmlite import ir

from edgeinfer.kernels.ir import call, shuffle, vec
from edgeinfer.kernels.isa.generic import (  # noqa: F401 - the interface, as generic's
    BIASED_WEIGHTS,
    BLOCKS_PER_STEP,
    HEAD_KERNELS,
    ONE_TAIL_STEP,
    STEPS_ADD_MINS,
    bias_correction,
    i16_pairs,
    i16_pairs_add,
    step_scales,
    superblock_sums_zmm,
    tile_rows,
    u8s8_pairs,
    wide_steps,
)

NAME = "dotprod"
_I8, _I32 = ir.IntType(8), ir.IntType(32)
SDOT = "llvm.aarch64.neon.sdot.v4i32.v16i8"


def i8_dot(builder, a, b, a_unsigned: bool):
    """Exact dot of 32 weight bytes a and activations b as <8 x i32> partial sums, x86's
    lanes (module docstring). Unsigned weights are below 128 here, so signed bytes hold
    them."""
    zero = ir.Constant(vec(_I32, 4), [0] * 4)
    halves = []
    for h in range(2):
        idx = list(range(16 * h, 16 * h + 16))
        halves.append(call(builder, SDOT, vec(_I32, 4), zero, shuffle(builder, a, a, idx),
                           shuffle(builder, b, b, idx)))
    return shuffle(builder, halves[0], halves[1], list(range(8)))


def scaled_dot(builder, acc, u, x, scales):
    """acc + the k-quants' scaled sums of 32 weights u (below 64) with activations x as
    <8 x i32>: lane j is scale(j) times products 4j .. 4j+3 (one sdot lane), where scales
    (<16 x i16>, one per pair of products) hold lane j's scale at pair 2j: the lanes and
    sums of u8s8_pairs + i16_pairs_add, exactly."""
    lane_scales = builder.sext(shuffle(builder, scales, scales, list(range(0, 16, 2))),
                               vec(_I32, 8))
    part = builder.mul(i8_dot(builder, u, x, True), lane_scales)
    return part if acc is None else builder.add(acc, part)


def block_dot(builder, q, x, corr, unsigned: bool):
    """The exact <8 x i32> dot of a block's weight bytes q with activations x."""
    return i8_dot(builder, q, x, unsigned)
