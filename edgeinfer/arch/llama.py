"""llama: SmolLM2, TinyLlama, Llama 2/3, Mistral (llama.cpp src/models/llama.cpp).

- RoPE is NORM (adjacent pairs): the converter (conversion/llama.py: LlamaModel.permute)
  reorders Q/K rows per head so that rotating (2i, 2i+1) on the GGUF weights equals HF's
  rotate_half on the originals. Native Mistral checkpoints arrive already interleaved.
- Llama 3.x rope scaling is baked into the optional `rope_freqs` tensor (divides the angle).
- `llama.attention.sliding_window` is not read by llama.cpp: attention is fully causal.
- `rope.dimension_count` must equal the head dim ("invalid n_rot" in llama.cpp).
"""

from __future__ import annotations

from edgeinfer.arch import Arch, register
from edgeinfer.config import ModelConfig, base_config
from edgeinfer.errors import EdgeInferError


def config_from_gguf(meta: dict) -> ModelConfig:
    config = base_config(meta, rope_neox=False)
    if config.n_rot != config.head_dim:
        raise EdgeInferError(f"invalid n_rot {config.n_rot} (head dim {config.head_dim})")
    return config


ARCH = register(
    Arch("llama", config_from_gguf, ("attn_norm", "attn_output", "ffn_norm", "ffn_down"))
)
