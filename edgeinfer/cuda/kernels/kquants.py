"""Dot products of one 32-value unit of a 256-value K-quant super-block (Q2_K..Q6_K) with
one Q8_1 activation block (llama.cpp ggml-cuda/vecdotq.cuh's approach; layouts from
ggml-quants.c's dequantize_row_*). Unit u is sub-block j = u % 8 of super-block u // 8.
Q2_K, Q3_K and Q6_K scale 16 values at a time, so a unit is two halves, each with its own
scale and its own activation sum (dp4a against ones). Signature as in legacy.py.
"""

from __future__ import annotations

from numba import cuda

from edgeinfer.cuda.kernels.prims import I64, dp4a, half, u32

ONES = 0x01010101
NIB = 0x0F0F0F0F


@cuda.jit(device=True)
def _scale_min_k4(w, row, sc, j):
    """Q4_K/Q5_K's 6-bit scale and min of sub-block j (ggml's get_scale_min_k4)."""
    if j < 4:
        return I64(w[row, sc + j]) & 63, I64(w[row, sc + j + 4]) & 63
    a, b, c = I64(w[row, sc + j + 4]), I64(w[row, sc + j - 4]), I64(w[row, sc + j])
    return (a & 0xF) | ((b >> 6) << 4), (a >> 4) | ((c >> 6) << 4)


@cuda.jit(device=True)
def _halves(v0, v1, v2, v3, v4, v5, v6, v7, xq, t, u):
    """(sumi, sum of x) of each 16-value half of a unit packed as v0..v7."""
    b = 8 * u
    si0 = dp4a(v3, xq[t, b + 3], dp4a(v2, xq[t, b + 2], dp4a(v1, xq[t, b + 1],
                                                            dp4a(v0, xq[t, b], 0))))
    si1 = dp4a(v7, xq[t, b + 7], dp4a(v6, xq[t, b + 6], dp4a(v5, xq[t, b + 5],
                                                            dp4a(v4, xq[t, b + 4], 0))))
    sx0 = dp4a(ONES, xq[t, b + 3], dp4a(ONES, xq[t, b + 2], dp4a(ONES, xq[t, b + 1],
                                                                dp4a(ONES, xq[t, b], 0))))
    sx1 = dp4a(ONES, xq[t, b + 7], dp4a(ONES, xq[t, b + 6], dp4a(ONES, xq[t, b + 5],
                                                                dp4a(ONES, xq[t, b + 4], 0))))
    return si0, si1, sx0, sx1


@cuda.jit(device=True)
def dot_q4_k(w, row, u, xq, xd, xs, xf, t):
    off, j = 144 * (u // 8), u % 8  # d, dmin f16, scales[12], qs[128]
    sc, m = _scale_min_k4(w, row, off + 4, j)
    qs, shift = off + 16 + 32 * (j // 2), 4 * (j % 2)
    sumi = 0
    for k in range(8):
        sumi = dp4a((u32(w, row, qs + 4 * k) >> shift) & NIB, xq[t, 8 * u + k], sumi)
    return (half(w, row, off) * sc * xd[t, u] * sumi
            - half(w, row, off + 2) * m * xs[t, u])


@cuda.jit(device=True)
def dot_q5_k(w, row, u, xq, xd, xs, xf, t):
    off, j = 176 * (u // 8), u % 8  # d, dmin, scales[12], qh[32], qs[128]
    sc, m = _scale_min_k4(w, row, off + 4, j)
    qs, shift = off + 48 + 32 * (j // 2), 4 * (j % 2)
    sumi = 0
    for k in range(8):
        v = ((u32(w, row, qs + 4 * k) >> shift) & NIB) | (
            ((u32(w, row, off + 16 + 4 * k) >> j) & ONES) << 4)
        sumi = dp4a(v, xq[t, 8 * u + k], sumi)
    return (half(w, row, off) * sc * xd[t, u] * sumi
            - half(w, row, off + 2) * m * xs[t, u])


@cuda.jit(device=True)
def _s8(v):
    return v - 256 if v >= 128 else v


@cuda.jit(device=True)
def dot_q6_k(w, row, u, xq, xd, xs, xf, t):
    off, j = 210 * (u // 8), u % 8  # ql[128], qh[64], scales[16] int8, d f16
    h, k4 = j // 4, j % 4
    ql, shift = off + 64 * h + 32 * (k4 % 2), 4 * (k4 // 2)
    qh, hshift = off + 128 + 32 * h, 2 * k4
    sc = off + 192 + 8 * h + 2 * k4

    def q(k):
        return ((u32(w, row, ql + 4 * k) >> shift) & NIB) | (
            ((u32(w, row, qh + 4 * k) >> hshift) & 0x03030303) << 4)

    si0, si1, sx0, sx1 = _halves(q(0), q(1), q(2), q(3), q(4), q(5), q(6), q(7), xq, t, u)
    s0, s1 = _s8(I64(w[row, sc])), _s8(I64(w[row, sc + 1]))
    return half(w, row, off + 208) * xd[t, u] * (s0 * (si0 - 32 * sx0) + s1 * (si1 - 32 * sx1))


@cuda.jit(device=True)
def _q3_scale(w, row, sc, i):
    lo = (I64(w[row, sc + i % 8]) >> (4 * (i // 8))) & 0xF
    hi = (I64(w[row, sc + 8 + i % 4]) >> (2 * (i // 4))) & 3
    return (lo | (hi << 4)) - 32


@cuda.jit(device=True)
def dot_q3_k(w, row, u, xq, xd, xs, xf, t):
    off, j = 110 * (u // 8), u % 8  # hmask[32], qs[64], scales[12], d f16
    h, k4 = j // 4, j % 4
    qs, shift, hbit = off + 32 + 32 * h, 2 * k4, 4 * h + k4

    def q(k):  # (q & 3) + 4 * hbit, 0..7: the value plus 4
        return ((u32(w, row, qs + 4 * k) >> shift) & 0x03030303) | (
            ((u32(w, row, off + 4 * k) >> hbit) & ONES) << 2)

    si0, si1, sx0, sx1 = _halves(q(0), q(1), q(2), q(3), q(4), q(5), q(6), q(7), xq, t, u)
    i = 8 * h + 2 * k4
    s0, s1 = _q3_scale(w, row, off + 96, i), _q3_scale(w, row, off + 96, i + 1)
    return half(w, row, off + 108) * xd[t, u] * (s0 * (si0 - 4 * sx0) + s1 * (si1 - 4 * sx1))


@cuda.jit(device=True)
def dot_q2_k(w, row, u, xq, xd, xs, xf, t):
    off, j = 84 * (u // 8), u % 8  # scales[16] (4-bit scale | 4-bit min), qs[64], d, dmin
    h, k4 = j // 4, j % 4
    qs, shift = off + 16 + 32 * h, 2 * k4

    def q(k):
        return (u32(w, row, qs + 4 * k) >> shift) & 0x03030303

    si0, si1, sx0, sx1 = _halves(q(0), q(1), q(2), q(3), q(4), q(5), q(6), q(7), xq, t, u)
    a, b = I64(w[row, off + 8 * h + 2 * k4]), I64(w[row, off + 8 * h + 2 * k4 + 1])
    d, dmin = half(w, row, off + 80), half(w, row, off + 82)
    return xd[t, u] * (d * ((a & 0xF) * si0 + (b & 0xF) * si1)
                       - dmin * ((a >> 4) * sx0 + (b >> 4) * sx1))
