"""An independent float64 numpy forward pass, written from llama.cpp's semantics
(llama.cpp src/models/{llama,qwen2,qwen3,phi3,gemma3}.cpp).

It shares no code with edgeinfer: it reads the file with gguf-py's own `GGUFReader`,
dequantizes every tensor with `gguf.quants.dequantize`, and computes in float64 with no
activation quantization and no F16 rounding, so it measures how far our kernels are from the
exact maths.
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

NEOX = {"llama": False, "qwen2": True, "qwen3": True, "phi3": True, "gemma3": True}


def load(path):
    reader = GGUFReader(path)
    meta = {name: field.contents() for name, field in reader.fields.items()}
    tensors = {}
    for t in reader.tensors:
        arr = dequantize(t.data, t.tensor_type).astype(np.float64)
        shape = tuple(int(d) for d in reversed(t.shape))
        tensors[t.name] = arr.reshape(shape)
    return meta, tensors


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, n_rot, base, neox):
    """x (n, heads, hd) rotated at positions pos (n,)."""
    x = x.copy()
    half = n_rot // 2
    inv = base ** (-2.0 * np.arange(half) / n_rot)
    ang = pos[:, None] * inv[None, :]  # (n, half)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if neox:
        a, b = x[..., :half].copy(), x[..., half:n_rot].copy()
        x[..., :half], x[..., half:n_rot] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
        x[..., 0:n_rot:2], x[..., 1:n_rot:2] = a * cos - b * sin, a * sin + b * cos
    return x


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def silu(x):
    return x / (1 + np.exp(-x))


def forward_without_window(path, tokens) -> np.ndarray:
    """The same model with its sliding window ignored (to show that the window matters)."""
    return forward(path, tokens, use_window=False)


def forward(path, tokens, use_window: bool = True) -> np.ndarray:
    """Logits (n, n_vocab) float64 for tokens at positions 0..n-1 of a fresh context."""
    meta, T = load(path)
    arch = meta["general.architecture"]
    def k(name, default=None):
        return meta.get(f"{arch}.{name}", default)

    n_embd, n_layer = k("embedding_length"), k("block_count")
    n_head = k("attention.head_count")
    n_kv = k("attention.head_count_kv", n_head)
    hd = k("attention.key_length", n_embd // n_head)
    n_rot = k("rope.dimension_count", hd)
    eps = k("attention.layer_norm_rms_epsilon")
    base = k("rope.freq_base", 10000.0)
    window = k("attention.sliding_window", 0) if arch == "gemma3" and use_window else 0
    pattern = k("attention.sliding_window_pattern", 6)
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    x = T["token_embd.weight"][np.asarray(tokens)]
    if arch == "gemma3":
        x = x * float(np.sqrt(np.float32(n_embd)))
    for il in range(n_layer):
        p = f"blk.{il}."
        def g(name, p=p):
            return T.get(p + name)

        a = rms(x, g("attn_norm.weight"), eps)
        if g("attn_qkv.weight") is not None:
            qkv = a @ g("attn_qkv.weight").T
            q, kk, v = np.split(qkv, [n_head * hd, n_head * hd + n_kv * hd], axis=1)
        else:
            q, kk, v = (a @ g(f"attn_{c}.weight").T for c in "qkv")
            q, kk, v = (t + g(f"attn_{c}.bias") if g(f"attn_{c}.bias") is not None else t
                        for t, c in zip((q, kk, v), "qkv"))
        q, kk, v = q.reshape(n, n_head, hd), kk.reshape(n, n_kv, hd), v.reshape(n, n_kv, hd)
        if g("attn_q_norm.weight") is not None:
            q, kk = rms(q, g("attn_q_norm.weight"), eps), rms(kk, g("attn_k_norm.weight"), eps)
        local = arch == "gemma3" and window > 0 and il % pattern < pattern - 1
        b = k("rope.freq_base_swa", 10000.0) if local else base
        q, kk = rope(q, pos, n_rot, b, NEOX[arch]), rope(kk, pos, n_rot, b, NEOX[arch])
        o = attend(q, kk, v, window if local else 0) @ g("attn_output.weight").T
        if g("post_attention_norm.weight") is not None:
            o = rms(o, g("post_attention_norm.weight"), eps)
        x = x + o
        h = rms(x, g("ffn_norm.weight"), eps)
        if g("ffn_gate.weight") is None:  # phi3 fused [gate | up]
            gate, up = np.split(h @ g("ffn_up.weight").T, 2, axis=1)
        else:
            gate, up = h @ g("ffn_gate.weight").T, h @ g("ffn_up.weight").T
        act = gelu_tanh(gate) if arch == "gemma3" else silu(gate)
        d = (act * up) @ g("ffn_down.weight").T
        if g("post_ffw_norm.weight") is not None:
            d = rms(d, g("post_ffw_norm.weight"), eps)
        x = x + d
    head = T.get("output.weight", T["token_embd.weight"])
    logits = rms(x, T["output_norm.weight"], eps) @ head.T
    if "output.bias" in T:
        logits = logits + T["output.bias"]
    return logits


def attend(q, k, v, window):
    """Causal GQA attention, scale 1/sqrt(hd); q (n, H, hd), k/v (n, KV, hd)."""
    n, n_head, hd = q.shape
    group = n_head // k.shape[1]
    out = np.zeros((n, n_head, hd))
    for i in range(n):
        lo = max(0, i - window + 1) if window else 0
        for h in range(n_head):
            kv = h // group
            s = k[lo : i + 1, kv] @ q[i, h] / math.sqrt(hd)
            pr = np.exp(s - s.max())
            out[i, h] = (pr / pr.sum()) @ v[lo : i + 1, kv]
    return out.reshape(n, n_head * hd)
