"""Dot products of 32 float weights (F32, F16, BF16) with float32 activations (xf).
The weights arrive as typed device arrays: float32, float16, or BF16 bits in uint16.
Signature as in legacy.py; a row shorter than the unit stops at its end."""

from __future__ import annotations

import numpy as np
from numba import cuda

from edgeinfer.cuda.kernels.prims import I64, f32_from_bits


@cuda.jit(device=True)
def dot_f32(w, row, u, xq, xd, xs, xf, t):
    s = np.float32(0)
    for i in range(32 * u, min(32 * u + 32, w.shape[1])):
        s += w[row, i] * xf[t, i]
    return s


@cuda.jit(device=True)
def dot_f16(w, row, u, xq, xd, xs, xf, t):
    s = np.float32(0)
    for i in range(32 * u, min(32 * u + 32, w.shape[1])):
        s += np.float32(w[row, i]) * xf[t, i]
    return s


@cuda.jit(device=True)
def dot_bf16(w, row, u, xq, xd, xs, xf, t):
    s = np.float32(0)
    for i in range(32 * u, min(32 * u + 32, w.shape[1])):
        s += f32_from_bits(I64(w[row, i]) << 16) * xf[t, i]
    return s
