"""qwen2 (llama.cpp src/models/qwen2.cpp): llama's forward with q/k/v biases and NEOX rope.

Sliding-window settings are neither written by the converter nor read by llama.cpp, so
attention is fully causal. An optional `output.bias` is added to the logits.
"""

from __future__ import annotations

from edgeinfer.arch import Arch, register
from edgeinfer.config import ModelConfig, base_config


def config_from_gguf(meta: dict) -> ModelConfig:
    return base_config(meta, rope_neox=True)


ARCH = register(
    Arch("qwen2", config_from_gguf, ("attn_norm", "attn_output", "ffn_norm", "ffn_down"))
)
