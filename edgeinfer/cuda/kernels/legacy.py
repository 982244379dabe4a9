"""Dot products of one 32-value GGML block (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) with one Q8_1
activation block, as llama.cpp's CUDA backend does them (ggml-cuda/vecdotq.cuh): the weight
nibbles packed four to an int, dp4a against the activation's int8s, the block offsets
through the activation sum s = d * sum(q).

Uniform signature (kernels/registry.py):  dot32(w, row, u, xq, xd, xs, xf, t) -> float32
    w (n_out, row_bytes) uint8; u the 32-value unit of the row; t the token;
    xq (n_tok, n_in/4) int32 (4 int8 each), xd, xs (n_tok, n_in/32) f32.
"""

from __future__ import annotations

from numba import cuda

from edgeinfer.cuda.kernels.prims import dp4a, half, u32

NIB = 0x0F0F0F0F


@cuda.jit(device=True)
def _nibble_dot(w, row, qs, xq, t, u, hi):
    """dp4a sum of 16 bytes of nibbles at qs with the unit's 32 activations; hi (Q5_*): the
    32 high bits, or -1 for none."""
    sumi = 0
    for k in range(4):
        v = u32(w, row, qs + 4 * k)
        lo, up = v & NIB, (v >> 4) & NIB
        if hi >= 0:
            for i in range(4):
                lo |= ((hi >> (4 * k + i)) & 1) << (8 * i + 4)
                up |= ((hi >> (16 + 4 * k + i)) & 1) << (8 * i + 4)
        sumi = dp4a(lo, xq[t, 8 * u + k], sumi)
        sumi = dp4a(up, xq[t, 8 * u + 4 + k], sumi)
    return sumi


@cuda.jit(device=True)
def dot_q4_0(w, row, u, xq, xd, xs, xf, t):
    off = 18 * u  # d f16, qs[16]
    sumi = _nibble_dot(w, row, off + 2, xq, t, u, -1)
    return half(w, row, off) * (xd[t, u] * sumi - 8.0 * xs[t, u])


@cuda.jit(device=True)
def dot_q4_1(w, row, u, xq, xd, xs, xf, t):
    off = 20 * u  # d, m f16, qs[16]
    sumi = _nibble_dot(w, row, off + 4, xq, t, u, -1)
    return half(w, row, off) * xd[t, u] * sumi + half(w, row, off + 2) * xs[t, u]


@cuda.jit(device=True)
def dot_q5_0(w, row, u, xq, xd, xs, xf, t):
    off = 22 * u  # d f16, qh u32, qs[16]
    sumi = _nibble_dot(w, row, off + 6, xq, t, u, u32(w, row, off + 2))
    return half(w, row, off) * (xd[t, u] * sumi - 16.0 * xs[t, u])


@cuda.jit(device=True)
def dot_q5_1(w, row, u, xq, xd, xs, xf, t):
    off = 24 * u  # d, m f16, qh u32, qs[16]
    sumi = _nibble_dot(w, row, off + 8, xq, t, u, u32(w, row, off + 4))
    return half(w, row, off) * xd[t, u] * sumi + half(w, row, off + 2) * xs[t, u]


@cuda.jit(device=True)
def dot_q8_0(w, row, u, xq, xd, xs, xf, t):
    off = 34 * u  # d f16, qs[32] int8
    sumi = 0
    for k in range(8):
        sumi = dp4a(u32(w, row, off + 2 + 4 * k), xq[t, 8 * u + k], sumi)
    return half(w, row, off) * xd[t, u] * sumi
