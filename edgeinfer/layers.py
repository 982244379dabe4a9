"""The transformer layers as one compiled call.

`run_layers` takes a batch of n tokens through every layer: a prompt prefill, a batched decode
step, or any mix (each token carries its own position and KV-cache slot). It serves every
registered architecture: what differs between them is data in the tables it receives
(biases, q/k norms, post-norms, sliding-window layers, the gated activation), not code.
Every kernel it runs was chosen at load (the matrix products' per tensor) and is called by
its address (kernels/native.py), so a decode step is a handful of calls from Python instead
of hundreds (docs/performance.md, "One compiled call"). Python does the embedding before it
and the output head after it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from edgeinfer.errors import EdgeInferError
from edgeinfer.kernels import native
from edgeinfer.kernels.native import call, weight_rows
from edgeinfer.kernels.ops import GEGLU_PARALLEL_VALUES, SWIGLU_PARALLEL_VALUES, parallel_rows
from edgeinfer.linear import act_views
from edgeinfer.tiles import PAD_TO  # the kernels' row tiles (tiles.py says why)

# A layer's matrices, in the order of LayerTable.weight's second axis: project() runs
# consecutive ones on one input (q/k/v, gate/up), converting it once per activation format.
LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
ATTN_Q, ATTN_OUTPUT, FFN_GATE, FFN_DOWN = 0, 3, 4, 6


class LayerTable(NamedTuple):
    """Every layer's tensors and kernels, stacked by layer (L = n_layer). An optional vector
    absent from the model is a (L, 0) array."""

    attn_norm: np.ndarray  # (L, n_embd)
    ffn_norm: np.ndarray  # (L, n_embd)
    post_attention_norm: np.ndarray  # (L, n_embd) gemma3
    post_ffw_norm: np.ndarray  # (L, n_embd) gemma3
    attn_q_norm: np.ndarray  # (L, hd) qwen3, gemma3
    attn_k_norm: np.ndarray  # (L, hd)
    attn_q_bias: np.ndarray  # (L, n_head * hd) qwen2
    attn_k_bias: np.ndarray  # (L, n_kv * hd)
    attn_v_bias: np.ndarray  # (L, n_kv * hd)
    attn_output_bias: np.ndarray  # (L, n_embd)
    swa: np.ndarray  # (L,) int64: 1 on sliding-window layers (local rope, windowed keys)
    weight: np.ndarray  # (L, 7, 3) int64: address, rows and row bytes of each of LINEARS
    kernel: np.ndarray  # (L, 7, 2) int64: its matmul and activation quantizer addresses
    act: np.ndarray  # (L, 7, 3) int64: its activation format (an id), block and sum block


class Buffers(NamedTuple):
    """Activations of up to n_batch tokens, the activation scratch (linear.ActScratch's
    buffers) and the KV cache: model.allocate_buffers."""

    x: np.ndarray  # (n_batch, n_embd) residual stream
    h: np.ndarray  # (n_batch, n_embd) normed input of a sub-block
    o: np.ndarray  # (n_batch, n_embd) sub-block output
    q: np.ndarray  # (n_batch, n_head, hd)
    k: np.ndarray  # (n_batch, n_kv, hd)
    v: np.ndarray  # (n_batch, n_kv, hd)
    attn: np.ndarray  # (n_batch, n_head, hd)
    gate: np.ndarray  # (n_batch, n_ff)
    up: np.ndarray  # (n_batch, n_ff)
    act: np.ndarray  # (n_batch, n_ff) act(gate) * up: apart from both (ops.py says why)
    xq: np.ndarray  # flat activation scratch, linear.ActScratch's
    xd: np.ndarray
    xs: np.ndarray
    xf: np.ndarray
    scores: np.ndarray  # (n_threads, m) attention scratch
    attn_shared: np.ndarray  # (k,) attention's decode-split scratch
    k_cache: np.ndarray  # (n_layer, n_blocks, B, n_kv, hd) F16 bits
    v_cache: np.ndarray
    kv_tables: np.ndarray  # (n_slots, n_ctx / B) int32: cell p of slot s is in block [s, p // B]


class Numerics(NamedTuple):
    """The model's constants the layers use (config.ModelConfig's, typed for the kernels)."""

    eps: float
    rope_neox: bool
    cos: np.ndarray  # (n_ctx, n_rot / 2) global rope table
    sin: np.ndarray
    cos_local: np.ndarray  # sliding-window layers' table (gemma3's own base)
    sin_local: np.ndarray
    q_scale: float  # multiplies q before attention (q_prescale models), else 1
    score_scale: np.float32  # multiplies the scores inside attention
    window: int  # sliding window of the swa layers
    gelu: bool  # GeGLU (gemma3) instead of SwiGLU
    gelu_table: np.ndarray


class Kernels(NamedTuple):
    """Addresses (native.address) of the kernels the loop calls, by native.SIGNATURES kind;
    0 for those this model never calls (they are not compiled). Row-wise ones come in pairs,
    (serial, parallel): ops.ROW_KERNELS."""

    rms_norm: tuple[int, int]
    rms_norm_inplace: tuple[int, int]  # q/k norms
    rope: int
    scale_inplace: int
    add_inplace: int
    add_bias: int
    store_kv: int
    attention: int
    attention_task: int  # the attention kernel's worker, its last argument
    glu: tuple[int, int]  # swiglu or geglu


def stack(vectors: list[np.ndarray | None], name: str) -> np.ndarray:
    """(L, dim) f32 from one optional vector per layer; (L, 0) when no layer has one."""
    if all(v is None for v in vectors):
        return np.zeros((len(vectors), 0), np.float32)
    if any(v is None for v in vectors):
        raise EdgeInferError(f"unsupported tensor layout: only some layers have {name}")
    return np.ascontiguousarray(np.stack(vectors), dtype=np.float32)


# A constant argument would compile a callee once per value (numba types it as a literal):
# _project's matrix indices go through np.int64, so it compiles once.
_i64 = np.int64


@njit(cache=True, nogil=True)
def _project(x, table, il, first, count, outs, buf):
    """outs[j] = x @ W.T for layer il's matrices first .. first + count - 1 (linear.project):
    x (n, n_in) converted once per run of matrices sharing an activation format. outs is
    always a 3-tuple (unused ones repeat a used one): one compiled function for 1, 2 or 3."""
    n, n_in = x.shape
    current = -1
    for j in range(count):
        m = first + j
        xq, xd, xs, xf = act_views(buf.xq, buf.xd, buf.xs, buf.xf, n, n_in,
                                   table.act[il, m, 1], table.act[il, m, 2])
        if table.act[il, m, 0] != current:
            call("quantize", table.kernel[il, m, 1], (x, xq, xd, xs, xf))
            current = table.act[il, m, 0]
        w = weight_rows(table.weight[il, m, 0], table.weight[il, m, 1], table.weight[il, m, 2])
        call("matmul", table.kernel[il, m, 0], (w, xq, xd, xs, xf, outs[j]))


@njit(cache=True, nogil=True)
def _rows(pair, n_rows):
    """The serial or parallel kernel of a (serial, parallel) pair: ops.by_rows."""
    return pair[1] if parallel_rows(n_rows, 0, 0) else pair[0]


# ---- each native call of the loop, named for its math

@njit(cache=True, nogil=True)
def project_qkv(h, table, il, qkv, buf):
    """(q, k, v) = h @ (Wq, Wk, Wv).T: (p, n_embd) -> (p, n_head|n_kv * hd)."""
    _project(h, table, il, _i64(ATTN_Q), _i64(3), qkv, buf)


@njit(cache=True, nogil=True)
def project_one(x, table, il, matrix, out, buf):
    """out = x @ W.T for one of layer il's LINEARS (attn_output, ffn_down)."""
    _project(x, table, il, matrix, _i64(1), (out, out, out), buf)


@njit(cache=True, nogil=True)
def project_gate_up(h, table, il, gate_up, buf):
    """(gate, up) = h @ (Wgate, Wup).T: (p, n_embd) -> (p, n_ff) x2."""
    _project(h, table, il, _i64(FFN_GATE), _i64(2), gate_up, buf)


@njit(cache=True, nogil=True)
def rms_norm(kern, x, weight, eps, out):
    """out = x / sqrt(mean(x^2) + eps) * weight, by rows: (rows, dim)."""
    call("rms_norm", _rows(kern.rms_norm, x.shape[0]), (x, weight, eps, out))


@njit(cache=True, nogil=True)
def head_norms(kern, q, k, q_weight, k_weight, eps):
    """q and k RMS-normed per head in place (qwen3, gemma3): (n, n_head|n_kv, hd) as rows of
    hd; nothing for a model without q/k norms (weights of size 0)."""
    if q_weight.shape[0]:
        q_rows, k_rows = q.reshape((-1, q.shape[2])), k.reshape((-1, k.shape[2]))
        call("rms_norm_inplace", _rows(kern.rms_norm_inplace, q_rows.shape[0]),
             (q_rows, q_weight, eps))
        call("rms_norm_inplace", _rows(kern.rms_norm_inplace, k_rows.shape[0]),
             (k_rows, k_weight, eps))


@njit(cache=True, nogil=True)
def add_bias(kern, x, bias):
    """x += bias by rows (qwen2's q/k/v and output biases); nothing for a (0,) bias."""
    if bias.shape[0]:
        call("add_bias", kern.add_bias, (x, bias))


@njit(cache=True, nogil=True)
def rope(kern, x, positions, cos, sin, neox):
    """x (n, heads, hd) rotated in place at each token's position: cos, sin (n_ctx, n_rot/2)."""
    call("rope", kern.rope, (x, positions, cos, sin, neox))


@njit(cache=True, nogil=True)
def scale(kern, x, factor):
    """x *= factor in place; nothing for a factor of 1."""
    if factor != 1.0:
        call("scale_inplace", kern.scale_inplace, (x, factor))


@njit(cache=True, nogil=True)
def store_kv(kern, k, v, slots, tables, positions, k_cache, v_cache):
    """k, v (n, n_kv, hd) written as F16 into the caches (n_blocks, B, n_kv, hd) at each
    token's slot and position, through the slots' block tables."""
    call("store_kv", kern.store_kv, (k, v, slots, tables, positions, k_cache, v_cache))


@njit(cache=True, nogil=True)
def attention(kern, q, k_cache, v_cache, slots, positions, window, score_scale, buf, out):
    """out (n, n_head, hd) = softmax(q . K^T * score_scale, causal, within `window` of each
    position when window > 0) . V, over each token's slot of the caches."""
    call("attention", kern.attention, (q, k_cache, v_cache, slots, buf.kv_tables, positions,
                                       window, score_scale, buf.scores, buf.attn_shared, out,
                                       kern.attention_task))


@njit(cache=True, nogil=True)
def glu(kern, gate, up, const, out):
    """out = act(gate) * up, act = gelu_tanh (GeGLU, gemma3) or silu (SwiGLU): (n, n_ff)."""
    n, n_ff = gate.shape
    least = GEGLU_PARALLEL_VALUES if const.gelu else SWIGLU_PARALLEL_VALUES
    kernel = kern.glu[1] if parallel_rows(n, n * n_ff, least) else kern.glu[0]
    if const.gelu:
        call("geglu", kernel, (gate, up, const.gelu_table, out))
    else:
        call("swiglu", kernel, (gate, up, out))


@njit(cache=True, nogil=True)
def add_residual(kern, x, o, post_norm, eps, scratch):
    """x += o, through the sub-block's post-norm (gemma3) when it has one, written into
    scratch (free by then): a kernel's output is never one of its inputs (ops.py says why)."""
    if post_norm.shape[0]:
        rms_norm(kern, o, post_norm, eps, scratch)
        call("add_inplace", kern.add_inplace, (x, scratch))
    else:
        call("add_inplace", kern.add_inplace, (x, o))


@njit(cache=True, nogil=True)
def product_rows(n, capacity):
    """Rows the matrix products of n tokens run on, given buffers of `capacity` rows."""
    if n > len(PAD_TO):
        return n
    return min(PAD_TO[n - 1], capacity) if n > 0 else n


@njit(cache=True, nogil=True)
def run_layers(n, positions, slots, table, buf, const, kern):
    """Tokens buf.x[:n] (already embedded) at positions (n,) in cache slots (n,), int32,
    through every layer; the result is left in buf.x[:n]. table: LayerTable, buf: Buffers,
    const: Numerics, kern: Kernels."""
    x, h, o = buf.x[:n], buf.h[:n], buf.o[:n]  # (n, n_embd)
    q, k, v, attn = buf.q[:n], buf.k[:n], buf.v[:n], buf.attn[:n]  # (n, n_head|n_kv, hd)
    gate, up, act = buf.gate[:n], buf.up[:n], buf.act[:n]  # (n, n_ff)
    # the matrix products run on p >= n rows (product_rows): rows past n are stale, unused
    p = product_rows(n, buf.x.shape[0])
    h_p, o_p, act_p = buf.h[:p], buf.o[:p], buf.act[:p]  # (p, n_embd), (p, n_ff)
    attn_p = buf.attn[:p].reshape((p, -1))  # (p, n_head * hd)
    qkv_p = (buf.q[:p].reshape((p, -1)), buf.k[:p].reshape((p, -1)),
             buf.v[:p].reshape((p, -1)))  # (p, n_head|n_kv * hd)
    gate_up_p = (buf.gate[:p], buf.up[:p], buf.up[:p])  # (p, n_ff)
    eps = const.eps
    for il in range(table.swa.shape[0]):
        local = table.swa[il] != 0  # sliding-window layer: its own rope table, a key window
        cos, sin = (const.cos_local, const.sin_local) if local else (const.cos, const.sin)
        window = const.window if local else 0
        k_cache, v_cache = buf.k_cache[il], buf.v_cache[il]  # (n_blocks, B, n_kv, hd)

        # attention: x += Wo . attention(rope(norm(Wq h)), rope(norm(Wk h)), Wv h)
        rms_norm(kern, x, table.attn_norm[il], eps, h)  # (n, n_embd)
        project_qkv(h_p, table, il, qkv_p, buf)  # (p, n_head|n_kv * hd)
        add_bias(kern, qkv_p[0], table.attn_q_bias[il])
        add_bias(kern, qkv_p[1], table.attn_k_bias[il])
        add_bias(kern, qkv_p[2], table.attn_v_bias[il])
        head_norms(kern, q, k, table.attn_q_norm[il], table.attn_k_norm[il], eps)
        rope(kern, q, positions, cos, sin, const.rope_neox)  # (n, n_head, hd)
        rope(kern, k, positions, cos, sin, const.rope_neox)  # (n, n_kv, hd)
        scale(kern, q, const.q_scale)
        store_kv(kern, k, v, slots, buf.kv_tables, positions, k_cache, v_cache)
        attention(kern, q, k_cache, v_cache, slots, positions, window, const.score_scale,
                  buf, attn)  # (n, n_head, hd)
        project_one(attn_p, table, il, _i64(ATTN_OUTPUT), o_p, buf)  # (p, n_embd)
        add_bias(kern, o, table.attn_output_bias[il])
        add_residual(kern, x, o, table.post_attention_norm[il], eps, h)  # (n, n_embd)

        # feed-forward: x += W_down . (act(W_gate h) * W_up h)
        rms_norm(kern, x, table.ffn_norm[il], eps, h)  # (n, n_embd)
        project_gate_up(h_p, table, il, gate_up_p, buf)  # (p, n_ff) x2
        glu(kern, gate, up, const, act)  # (n, n_ff)
        project_one(act_p, table, il, _i64(FFN_DOWN), o_p, buf)  # (p, n_embd)
        add_residual(kern, x, o, table.post_ffw_norm[il], eps, h)  # (n, n_embd)


# ---- the tables, built once at load

FFN_GELU = {"silu": False, "gelu_tanh": True}  # ModelConfig.ffn_act -> Numerics.gelu


def layer_table(blocks, swa_layers) -> LayerTable:
    """The LayerTable of weights.BlockWeights and ModelConfig.swa_layers; compiles (or
    loads from the cache) each matmul and activation kernel the model needs."""
    acts: dict[str, int] = {}
    weight, kernel, act = [], [], []
    for b in blocks:
        for name in LINEARS:
            lin = getattr(b, name)
            fmt = lin.fmt
            if not lin.weight.flags.c_contiguous:  # the loop sees rows at a fixed stride
                raise EdgeInferError(f"tensor '{lin.name}' is not stored row after row")
            weight.append((lin.weight.ctypes.data, lin.weight.shape[0], lin.weight.shape[1]))
            kernel.append((native.address(fmt.matmul, "matmul"),
                           native.address(fmt.act.quantize, "quantize")))
            act.append((acts.setdefault(fmt.act.name, len(acts)), fmt.act.block,
                        fmt.act.sum_block))
    n = len(blocks)

    def vectors(name):
        return stack([getattr(b, name) for b in blocks], name)

    q_norm, k_norm = vectors("attn_q_norm"), vectors("attn_k_norm")
    if q_norm.shape[1] != k_norm.shape[1]:  # the loop norms both or neither
        raise EdgeInferError("unsupported tensor layout: attn_q_norm without attn_k_norm "
                             "or the other way round")
    return LayerTable(
        attn_norm=vectors("attn_norm"), ffn_norm=vectors("ffn_norm"),
        post_attention_norm=vectors("post_attention_norm"),
        post_ffw_norm=vectors("post_ffw_norm"),
        attn_q_norm=q_norm, attn_k_norm=k_norm,
        attn_q_bias=vectors("attn_q_bias"), attn_k_bias=vectors("attn_k_bias"),
        attn_v_bias=vectors("attn_v_bias"), attn_output_bias=vectors("attn_output_bias"),
        swa=np.array(swa_layers, np.int64).reshape(n),
        weight=np.array(weight, np.int64).reshape(n, len(LINEARS), 3),
        kernel=np.array(kernel, np.int64).reshape(n, len(LINEARS), 2),
        act=np.array(act, np.int64).reshape(n, len(LINEARS), 3),
    )


def numerics(config, weights, n_ctx: int) -> Numerics:
    """The Numerics of a model config, with rope tables for n_ctx positions."""
    from edgeinfer.kernels.ops import GELU_TABLE, rope_table

    if config.ffn_act not in FFN_GELU:
        raise EdgeInferError(f"unsupported feed-forward activation {config.ffn_act}")
    cos, sin = rope_table(n_ctx, config.n_rot, config.rope_base, config.rope_freq_scale,
                          weights.rope_freqs)
    cos_local, sin_local = rope_table(n_ctx, config.n_rot, config.rope_base_swa, 1.0)
    return Numerics(
        eps=float(config.norm_eps), rope_neox=bool(config.rope_neox), cos=cos, sin=sin,
        cos_local=cos_local, sin_local=sin_local,
        q_scale=float(config.attn_scale) if config.q_prescale else 1.0,
        score_scale=np.float32(1.0 if config.q_prescale else config.attn_scale),
        window=int(config.sliding_window), gelu=FFN_GELU[config.ffn_act],
        gelu_table=GELU_TABLE)


def kernels(blocks, c: Numerics, flash_attn: bool) -> Kernels:
    """The Kernels the loop calls for a model's weights.BlockWeights (compiled or loaded from
    the cache now)."""
    from edgeinfer.kernels import attention as attention_kernels
    from edgeinfer.kernels import flash, ops

    def need(kernel, kind: str, used: bool = True) -> int:
        return native.address(kernel, kind) if used else 0

    def pair(kind: str, used: bool = True) -> tuple[int, int]:
        return tuple(need(kernel, kind, used) for kernel in ops.ROW_KERNELS[kind])

    def some(name: str) -> bool:
        return any(getattr(b, name) is not None for b in blocks)

    has_bias = any(map(some, ("attn_q_bias", "attn_k_bias", "attn_v_bias", "attn_output_bias")))
    # attention first (the most compile time): a cold load's compile helper ends with it
    attention_task = (flash if flash_attn else attention_kernels).task_address()
    attention_kernel = need(
        flash.flash_attention if flash_attn else attention_kernels.attention, "attention")
    return Kernels(
        rms_norm=pair("rms_norm"),
        rms_norm_inplace=pair("rms_norm_inplace", some("attn_q_norm")),
        rope=need(ops.rope, "rope"),
        scale_inplace=need(ops.scale_inplace, "scale_inplace", c.q_scale != 1.0),
        add_inplace=need(ops.add_inplace, "add_inplace"),
        add_bias=need(ops.add_bias, "add_bias", has_bias),
        store_kv=need(attention_kernels.store_kv, "store_kv"),
        attention=attention_kernel,
        attention_task=attention_task,
        glu=pair("geglu" if c.gelu else "swiglu"),
    )
