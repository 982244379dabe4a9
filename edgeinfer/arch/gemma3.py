"""gemma3: Gemma 3 270M/1B/4B/12B/27B text (llama.cpp src/models/gemma3.cpp).

- Embeddings are multiplied by sqrtf(n_embd) in f32 (llama.cpp's unrounded value, not HF's
  bf16-rounded one).
- Norm weights are stored as (1 + w): the converter (conversion/gemma.py: norm_shift) adds
  the one, so we multiply by the stored value and must not add 1 again.
- Per-head q/k RMSNorm, NEOX rope; post-attention and post-FFN norms; GELU-tanh gated FFN.
- Sliding window: layer il is local when il % pattern < pattern - 1 (pattern default 6), or
  per the bool array; local layers use `rope.freq_base_swa` (default 10000) and no rope
  scaling; global layers `rope.freq_base` with the linear factor.
- Q is multiplied by the attention scale in f32 after rope (kq_scale = 1): 1/sqrt(hd), or
  1/sqrt(n_embd/n_head) for the 62-layer 27B model.
- Optional final logit soft-capping (`gemma3.final_logit_softcapping`, absent in Gemma 3).
"""

from __future__ import annotations

import math

import numpy as np

from edgeinfer.arch import Arch, register
from edgeinfer.config import ModelConfig, base_config

BLOCK_TENSORS = (
    "attn_norm", "attn_q_norm", "attn_k_norm", "attn_output", "post_attention_norm",
    "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm",
)


def _swa_layers(meta: dict, n_layer: int) -> tuple[bool, ...]:
    if int(meta.get("gemma3.attention.sliding_window", 0) or 0) <= 0:
        return (False,) * n_layer
    pattern = meta.get("gemma3.attention.sliding_window_pattern", 6)
    if hasattr(pattern, "__len__"):
        return tuple(bool(v) for v in pattern)
    pattern = int(pattern)
    return tuple(il % pattern < pattern - 1 for il in range(n_layer))


def config_from_gguf(meta: dict) -> ModelConfig:
    n_layer = int(meta["gemma3.block_count"])
    n_embd = int(meta["gemma3.embedding_length"])
    n_head = int(meta["gemma3.attention.head_count"])
    head_dim = int(meta.get("gemma3.attention.key_length", n_embd // n_head))
    scale = 1.0 / math.sqrt(n_embd / n_head if n_layer == 62 else head_dim)
    return base_config(
        meta,
        rope_neox=True,
        rope_base_swa=float(meta.get("gemma3.rope.freq_base_swa", 10000.0)),
        sliding_window=int(meta.get("gemma3.attention.sliding_window", 0) or 0),
        swa_layers=_swa_layers(meta, n_layer),
        attn_scale=scale,
        q_prescale=True,
        embd_scale=float(np.sqrt(np.float32(n_embd))),
        ffn_act="gelu_tanh",
        final_softcap=float(meta.get("gemma3.final_logit_softcapping", 0.0) or 0.0),
    )


ARCH = register(Arch("gemma3", config_from_gguf, BLOCK_TENSORS))
