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
from dataclasses import replace

import numpy as np

from edgeinfer.arch import Arch, register
from edgeinfer.config import MAX_LAYERS, ArchKeys, ModelConfig, base_config

BLOCK_TENSORS = (
    "attn_norm", "attn_q_norm", "attn_k_norm", "attn_output", "post_attention_norm",
    "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm",
)


def _swa_layers(keys: ArchKeys, window: int, n_layer: int) -> tuple[bool, ...]:
    if window == 0:
        return (False,) * n_layer
    pattern = keys.get("attention.sliding_window_pattern", 6)
    if isinstance(pattern, np.ndarray):
        if len(pattern) != n_layer:
            raise keys.fail("attention.sliding_window_pattern", pattern,
                            f"an integer or {n_layer} booleans, one per layer")
        return tuple(bool(v) for v in pattern)
    pattern = keys.int("attention.sliding_window_pattern", 6, hi=MAX_LAYERS)
    return tuple(il % pattern < pattern - 1 for il in range(n_layer))


def config_from_gguf(meta: dict) -> ModelConfig:
    config = base_config(meta, rope_neox=True, q_prescale=True, ffn_act="gelu_tanh")
    keys = ArchKeys(meta, "gemma3")
    window = keys.int("attention.sliding_window", 0, lo=0, hi=1 << 30)
    head_size = config.n_embd / config.n_head if config.n_layer == 62 else config.head_dim
    return replace(
        config,
        rope_base_swa=keys.float("rope.freq_base_swa", 10000.0),
        sliding_window=window,
        swa_layers=_swa_layers(keys, window, config.n_layer),
        attn_scale=1.0 / math.sqrt(head_size),
        embd_scale=float(np.sqrt(np.float32(config.n_embd))),
        final_softcap=keys.float("final_logit_softcapping", 0.0, positive=False),
    )


ARCH = register(Arch("gemma3", config_from_gguf, BLOCK_TENSORS))
