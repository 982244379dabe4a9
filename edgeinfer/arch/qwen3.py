"""qwen3 (llama.cpp src/models/qwen3.cpp): NEOX rope, per-head RMSNorm of Q and K.

The head dim comes from `qwen3.attention.key_length` and n_head*hd may exceed n_embd
(Qwen3-0.6B: 16x128 vs 1024). Q/K are projected, normed per head (one weight shared by all
heads, model eps), then roped; V is not normed.
"""

from __future__ import annotations

from edgeinfer.arch import Arch, register
from edgeinfer.config import ModelConfig, base_config

BLOCK_TENSORS = ("attn_norm", "attn_q_norm", "attn_k_norm", "attn_output", "ffn_norm", "ffn_down")


def config_from_gguf(meta: dict) -> ModelConfig:
    return base_config(meta, rope_neox=True)


ARCH = register(Arch("qwen3", config_from_gguf, BLOCK_TENSORS))
