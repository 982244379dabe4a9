"""Every CUDA kernel on small shapes against an independent reference: under numba-cuda's
simulator in CI (tests/conftest.py), on the GPU with NUMBA_ENABLE_CUDASIM=0."""

from __future__ import annotations  # noqa: I001 (the skip in cuda_helpers comes first)

import numpy as np
import pytest
from gguf.quants import dequantize

from tests.cuda_helpers import q8_1_reference, rel_err  # skips the module without numba-cuda
from tests.reference import gelu_tanh, silu
from tests.tiny_models import random_weight

# edgeinfer's own modules import plainly: an ImportError of ours fails, it does not skip
import edgeinfer.cuda.kernels.matmul as mm  # noqa: E402
import edgeinfer.cuda.kernels.registry as registry  # noqa: E402
CUDA_FORMATS, device_rows = registry.CUDA_FORMATS, registry.device_rows

TYPES = sorted(CUDA_FORMATS, key=lambda q: q.name)


def quantized(x):
    n, n_in = x.shape
    xq = np.zeros((n, n_in // 4), np.int32)
    xd, xs = np.zeros((n, n_in // 32), np.float32), np.zeros((n, n_in // 32), np.float32)
    grid, block = mm.quantize_grid(n, n_in)
    mm.quantize_q8_1[grid, block](x, xq, xd, xs, n)
    return xq, xd, xs


def test_quantize_q8_1_matches_llama_cpp_reference():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 96)) * 2).astype(np.float32)
    x[1, 32:64] = 0  # an all-zero block: d = 0, q = 0
    x[2, :4] = [127.0 / 254, -127.0 / 254, 1.5, -1.5]  # halves round away from zero
    xq, xd, xs = quantized(x)
    q, d, s = q8_1_reference(x)
    np.testing.assert_array_equal(xq.view(np.int8), q)
    np.testing.assert_array_equal(xd, d)
    np.testing.assert_allclose(xs, s, rtol=1e-6)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_matmul_matches_dequantized_reference(qtype):
    rng = np.random.default_rng(int(qtype))
    n_out, n_in, n_tok = 6, 512, 5  # rows and tokens past a tile's edge
    raw = random_weight(rng, (n_out, n_in), qtype)
    w64 = dequantize(raw, qtype).astype(np.float64).reshape(n_out, n_in)
    fmt = CUDA_FORMATS[qtype]
    w = device_rows(fmt, raw.view(np.uint8).reshape(n_out, -1), n_in)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    xq, xd, xs = quantized(x)
    bias = rng.standard_normal(n_out).astype(np.float32)
    out = np.full((n_tok, n_out + 3), 7.0, np.float32)
    grid, block = mm.matmul_grid(n_out, n_tok)
    mm.make_matmul(fmt.dot32)[grid, block](w, xq, xd, xs, x, bias, out, 2, n_tok)
    # the activations the kernel saw: dequantized Q8_1 for quantized types, x for floats
    q, d, _ = q8_1_reference(x)
    x_seen = ((q.reshape(n_tok, -1, 32) * d[..., None]).reshape(n_tok, n_in)
              if fmt.quantized else x).astype(np.float64)
    assert rel_err(out[:, 2 : 2 + n_out], x_seen @ w64.T + bias) < 1e-5
    assert rel_err(out[:, 2 : 2 + n_out], x.astype(np.float64) @ w64.T + bias) < 0.02
    assert (out[:, :2] == 7).all() and (out[:, 2 + n_out :] == 7).all()  # only its columns


def rms64(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("post", [False, True], ids=["plain", "post_norm"])
def test_add_norm_quant(post):
    from edgeinfer.cuda.kernels.norms import NT, add_norm_quant

    rng = np.random.default_rng(1)
    n, dim, eps = 3, 96, 1e-6
    x, o = (rng.standard_normal((n, dim)).astype(np.float32) for _ in range(2))
    post_w, norm_w = (1 + 0.1 * rng.standard_normal((2, dim))).astype(np.float32)
    post_w = post_w if post else np.zeros(0, np.float32)
    h = np.zeros((n, dim), np.float32)
    xq, xd, xs = (np.zeros((n, dim // 4), np.int32), np.zeros((n, dim // 32), np.float32),
                  np.zeros((n, dim // 32), np.float32))
    src = np.arange(n, dtype=np.int32)[::-1].copy()  # ignored: there is a residual
    x_new = x + (rms64(o, post_w, eps) if post else o)
    add_norm_quant[n, NT](x, o, post_w, norm_w, eps, src, h, xq, xd, xs)
    np.testing.assert_allclose(x, x_new, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h, rms64(x_new, norm_w, eps), rtol=1e-5, atol=1e-5)
    q, d, s = q8_1_reference(h)
    np.testing.assert_array_equal(xq.view(np.int8), q)
    np.testing.assert_array_equal(xd, d)
    # the output head: no residual, the rows src picks, x untouched
    x_before, none = x.copy(), np.zeros((0, dim), np.float32)
    add_norm_quant[2, NT](x, none, post_w, norm_w, eps, src, h, xq, xd, xs)
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_allclose(h[:2], rms64(x[src[:2]], norm_w, eps), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gelu", [False, True], ids=["swiglu", "geglu"])
def test_glu_quant(gelu):
    from edgeinfer.cuda.kernels.norms import NT, glu_quant

    rng = np.random.default_rng(2)
    n, n_ff = 2, 64
    gate_up = (rng.standard_normal((n, 2 * n_ff)) * 3).astype(np.float32)
    act = np.zeros((n, n_ff), np.float32)
    xq, xd, xs = (np.zeros((n, n_ff // 4), np.int32), np.zeros((n, n_ff // 32), np.float32),
                  np.zeros((n, n_ff // 32), np.float32))
    glu_quant[n, NT](gate_up, gelu, act, xq, xd, xs)
    g, u = gate_up[:, :n_ff].astype(np.float64), gate_up[:, n_ff:]
    np.testing.assert_allclose(act, (gelu_tanh(g) if gelu else silu(g)) * u, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_array_equal(xq.view(np.int8), q8_1_reference(act)[0])


def cells(pool, tables):
    """A paged cache (n_blocks, n_kv, B, hd) as each slot's cells, (n_slots, n_kv, n_ctx, hd)."""
    return np.stack([np.concatenate([pool[b] for b in row], axis=1) for row in tables])


def rope64(x, cos, sin, neox, n_rot):
    """x (heads, hd) rotated with one position's cos, sin (n_rot/2,), float64."""
    x, half = x.astype(np.float64).copy(), n_rot // 2
    i = np.arange(half) if neox else 2 * np.arange(half)
    j = i + half if neox else i + 1
    a, b = x[:, i].copy(), x[:, j].copy()
    x[:, i], x[:, j] = a * cos - b * sin, a * sin + b * cos
    return x


@pytest.mark.parametrize("neox,norm", [(False, False), (True, True)], ids=["llama", "qwen3"])
def test_rope_store(neox, norm):
    from edgeinfer.cuda.kernels.attention import rope_store

    rng = np.random.default_rng(3)
    n, n_head, n_kv, hd, n_rot, n_ctx, eps = 3, 4, 2, 16, 12, 8, 1e-6  # partial rotary
    qkv = rng.standard_normal((n, (n_head + 2 * n_kv) * hd)).astype(np.float32)
    q_norm, k_norm = ((1 + 0.1 * rng.standard_normal((2, hd))).astype(np.float32) if norm
                      else (np.zeros(0, np.float32),) * 2)
    ang = rng.uniform(0, 6, (n_ctx, n_rot // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    positions, slots = np.array([5, 1, 7], np.int32), np.array([1, 0, 1], np.int32)
    q_out = np.zeros((n, n_head, hd), np.float32)
    k_tmp = np.zeros((n, n_kv, hd), np.float32)
    bs = 4  # cells per block; the slots' blocks out of order
    tables = np.array([[2, 0], [3, 1]], np.int32)
    k_cache, v_cache = (np.zeros((4, n_kv, bs, hd), np.float16) for _ in range(2))
    ref = qkv.astype(np.float64).reshape(n, -1, hd)
    rope_store[(n_head + n_kv, n), 32](qkv, q_norm, k_norm, eps, cos, sin, neox, n_rot,
                                       np.float32(0.5), positions, slots, tables, q_out, k_tmp,
                                       k_cache, v_cache)
    k_cache, v_cache = (cells(c, tables) for c in (k_cache, v_cache))  # (slots, kv, ctx, hd)
    for t in range(n):
        p, s = positions[t], slots[t]
        q, k, v = ref[t, :n_head], ref[t, n_head : n_head + n_kv], ref[t, n_head + n_kv :]
        if norm:
            q, k = rms64(q, q_norm, eps), rms64(k, k_norm, eps)
        q, k = rope64(q, cos[p], sin[p], neox, n_rot), rope64(k, cos[p], sin[p], neox, n_rot)
        np.testing.assert_allclose(q_out[t], 0.5 * q, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(k_cache[s, :, p], k, rtol=2e-3, atol=2e-3)  # F16
        np.testing.assert_array_equal(v_cache[s, :, p], v.astype(np.float16))
    assert not k_cache[0, :, 5].any()  # nothing written at (slot 0, position 5)


@pytest.mark.parametrize("window", [0, 3])
def test_attention_online_softmax(window):
    from edgeinfer.cuda.kernels.attention import attention

    rng = np.random.default_rng(4)
    n_head, n_kv, hd, n_ctx = 4, 2, 64, 40  # 40 keys: two chunks of 32
    bs = 8  # cells per block; the two slots' blocks shuffled through one pool
    tables = rng.permutation(10).astype(np.int32).reshape(2, n_ctx // bs)
    pool_k, pool_v = (rng.standard_normal((10, n_kv, bs, hd)).astype(np.float16)
                      for _ in range(2))
    k_cache, v_cache = (cells(c, tables) for c in (pool_k, pool_v))  # (slots, kv, ctx, hd)
    positions, slots = np.array([0, 33, 39], np.int32), np.array([0, 1, 0], np.int32)
    q = rng.standard_normal((3, n_head, hd)).astype(np.float32)
    out = np.zeros((3, n_head * hd), np.float32)
    scale = np.float32(1 / np.sqrt(hd))
    xq = np.zeros((3, n_head * hd // 4), np.int32)  # its Q8_1 blocks, fused (hd % 32 == 0)
    xd, xs = (np.zeros((3, n_head * hd // 32), np.float32) for _ in range(2))
    attention[(n_head, 3), 32](q, pool_k, pool_v, slots, tables, positions, window, scale,
                               out, xq, xd, xs)
    q8, d8, s8 = q8_1_reference(out)
    np.testing.assert_array_equal(xq.view(np.int8), q8)
    np.testing.assert_array_equal(xd, d8)
    np.testing.assert_allclose(xs, s8, rtol=1e-6)
    for t in range(3):
        p, s = positions[t], slots[t]
        lo = max(0, p - window + 1) if window else 0
        for h in range(n_head):
            kvh = h // (n_head // n_kv)
            keys = k_cache[s, kvh, lo : p + 1].astype(np.float64)
            sc = keys @ q[t, h] * scale
            pr = np.exp(sc - sc.max())
            ref = (pr / pr.sum()) @ v_cache[s, kvh, lo : p + 1].astype(np.float64)
            np.testing.assert_allclose(out[t, h * hd : (h + 1) * hd], ref, rtol=1e-4,
                                       atol=1e-5)
