"""Matrix products on the device: activations quantized to Q8_1 blocks, then one kernel per
weight type that takes a tile of ROWS output rows (a warp each) by TILE tokens; the lanes of
a warp stride over the row's 32-value units and reduce at the end. One kernel serves decode
(1 token, grid.y = 1) and prefill (grid.y = n / TILE).

    matmul(w, xq, xd, xs, xf, bias, out, col0, n_tok)
        out[t, col0 + r] = sum_i W[r, i] x[t, i] (+ bias[r]); bias of size 0 for none
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from edgeinfer.cuda.kernels.prims import WARP, to_i32, warp_sums

ROWS = 4  # warps (output rows) per block
TILE = 4  # tokens per block
QBLOCK = 32  # values per Q8_1 activation block
RED_SHAPE = (TILE, ROWS * WARP)  # the simulator's reduction scratch (shapes must be constants)


def make_matmul(dot32):
    """The matmul kernel of one weight type's dot32 (kernels/registry.py). Blocks stride
    over row tiles and token tiles, so any grid covers the product (matmul_grid)."""

    def matmul(w, xq, xd, xs, xf, bias, out, col0, n_tok):
        lane, wy = cuda.threadIdx.x, cuda.threadIdx.y
        tid = wy * WARP + lane
        red = cuda.shared.array(RED_SHAPE, np.float32)
        acc = cuda.local.array(TILE, np.float32)
        n_units = (xf.shape[1] + QBLOCK - 1) // QBLOCK
        for r0 in range(cuda.blockIdx.x * ROWS, w.shape[0], cuda.gridDim.x * ROWS):
            row = r0 + wy
            live = row < w.shape[0]
            for t0 in range(cuda.blockIdx.y * TILE, n_tok, cuda.gridDim.y * TILE):
                for i in range(TILE):
                    acc[i] = 0
                    if live and t0 + i < n_tok:
                        for u in range(lane, n_units, WARP):
                            acc[i] += dot32(w, row, u, xq, xd, xs, xf, t0 + i)
                warp_sums(acc, red, tid)
                if lane == 0 and live:
                    for i in range(min(TILE, n_tok - t0)):
                        out[t0 + i, col0 + row] = acc[i] + (bias[row] if bias.shape[0] else 0)

    return cuda.jit(matmul)


def matmul_grid(n_out: int, n_tok: int, max_blocks: int = 1 << 16
                ) -> tuple[tuple[int, int], tuple[int, int]]:
    """(grid, block) of a product; at most max_blocks blocks along each axis."""
    return ((min(math.ceil(n_out / ROWS), max_blocks), min(math.ceil(n_tok / TILE), max_blocks)),
            (WARP, ROWS))


@cuda.jit(device=True)
def round_half_away(v):
    """C's roundf: halves away from zero (llama.cpp's quantize_q8_1)."""
    return math.floor(v + 0.5) if v >= 0 else -math.floor(-v + 0.5)


@cuda.jit(device=True)
def quantize_block(x, t, b, xq, xd, xs):
    """Values x[t, 32b : 32b + 32] as a Q8_1 block: int8s four to an int32 in xq[t, 8b..],
    d = amax / 127 in xd, d * sum(q) in xs."""
    amax = np.float32(0)
    for i in range(QBLOCK):
        amax = max(amax, abs(x[t, QBLOCK * b + i]))
    d = amax / np.float32(127)
    inv = np.float32(1) / d if d > 0 else np.float32(0)
    total = 0
    for k in range(8):
        packed = 0
        for i in range(4):
            q = int(round_half_away(x[t, QBLOCK * b + 4 * k + i] * inv))
            total += q
            packed |= (q & 0xFF) << (8 * i)
        xq[t, 8 * b + k] = to_i32(packed)
    xd[t, b] = d
    xs[t, b] = d * total


@cuda.jit
def quantize_q8_1(x, xq, xd, xs, n_tok):
    """Every 32-value block of x[:n_tok] (n, n_in) as Q8_1, a thread per block."""
    i = cuda.grid(1)
    nb = x.shape[1] // QBLOCK
    if i < n_tok * nb:
        quantize_block(x, i // nb, i % nb, xq, xd, xs)


def quantize_grid(n_tok: int, n_in: int) -> tuple[int, int]:
    return math.ceil(n_tok * (n_in // QBLOCK) / 128), 128
