"""Row kernels of the layer loop, fused so that a sub-block boundary is one launch: the
residual add (through gemma3's post-norm), the next RMSNorm and the Q8_1 quantization of
its output; and the gated activation with its quantization. A block of NT threads per token.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from edgeinfer.cuda.kernels.matmul import QBLOCK, quantize_block
from edgeinfer.cuda.kernels.prims import block_sum

NT = 128  # threads per token row at most (the simulator launches fewer)

GELU_C = np.float32(math.sqrt(2.0 / math.pi))


@cuda.jit(device=True)
def _rms_scale(x, t, n, eps, red, tid):
    nt = cuda.blockDim.x
    ss = np.float32(0)
    for i in range(tid, n, nt):
        ss += x[t, i] * x[t, i]
    ss = block_sum(ss, red, tid, nt)
    return np.float32(1) / math.sqrt(ss / n + eps)


@cuda.jit
def add_norm_quant(x, o, post_w, norm_w, eps, src, h, xq, xd, xs):
    """Token t = blockIdx.x: x[t] += post_norm(o[t]) when o has rows (o's own RMSNorm times
    post_w when post_w has a size, else o as is); then, when norm_w has a size,
    h[t] = rms_norm(x[s]) * norm_w and its Q8_1 blocks, s = t, or src[t] when o is empty
    (the output head norms only the rows whose logits are wanted; with a residual to add,
    another block's row may not be final yet)."""
    t, tid, nt = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
    red = cuda.shared.array(NT, np.float32)
    n = x.shape[1]
    if o.shape[0]:
        if post_w.shape[0]:
            r = _rms_scale(o, t, n, eps, red, tid)
            for i in range(tid, n, nt):
                x[t, i] += o[t, i] * r * post_w[i]
        else:
            for i in range(tid, n, nt):
                x[t, i] += o[t, i]
        cuda.syncthreads()
    if norm_w.shape[0]:
        s = t if o.shape[0] else src[t]
        r = _rms_scale(x, s, n, eps, red, tid)
        for i in range(tid, n, nt):
            h[t, i] = x[s, i] * r * norm_w[i]
        cuda.syncthreads()
        for b in range(tid, n // QBLOCK, nt):
            quantize_block(h, t, b, xq, xd, xs)


@cuda.jit(device=True)
def _act(g, gelu):
    if gelu:  # gelu_tanh
        return np.float32(0.5) * g * (np.float32(1) + math.tanh(
            GELU_C * g * (np.float32(1) + np.float32(0.044715) * g * g)))
    return g / (np.float32(1) + math.exp(-g))  # silu


@cuda.jit
def glu_quant(gate_up, gelu, act, xq, xd, xs):
    """act[t] = act(gate) * up, gate_up[t] = (gate | up), each (n_ff,); then its Q8_1 blocks."""
    t, tid, nt = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
    n_ff = act.shape[1]
    for i in range(tid, n_ff, nt):
        act[t, i] = _act(gate_up[t, i], gelu) * gate_up[t, n_ff + i]
    cuda.syncthreads()
    for b in range(tid, n_ff // QBLOCK, nt):
        quantize_block(act, t, b, xq, xd, xs)
