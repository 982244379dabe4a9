"""phi3: Phi-3, Phi-3.5, Phi-4 (llama.cpp src/models/phi3.cpp).

- Fused `attn_qkv` with rows [Q | K | V]; fused `ffn_up` with rows [gate | up] (no
  `ffn_gate`): the loader splits both into zero-copy row views.
- NEOX rope, possibly partial (`rope.dimension_count` < head dim: the rest passes through).
- Q is multiplied by 1/sqrt(hd) in f32 before attention (kq_scale = 1).
- `phi3.attention.sliding_window` is read and then disabled by llama.cpp ("Phi SWA is
  currently disabled"): attention is fully causal.
- LongRoPE (factor tensors `rope_factors_long/short`, with `rope.scaling.attn_factor`) is
  refused at load rather than run without its factors.
"""

from __future__ import annotations

from edgeinfer.arch import Arch, register
from edgeinfer.config import ModelConfig, base_config
from edgeinfer.errors import EdgeInferError


def config_from_gguf(meta: dict) -> ModelConfig:
    if "phi3.rope.scaling.attn_factor" in meta:  # written only with rope_factors_long/short
        raise EdgeInferError("unsupported rope scaling: phi3 LongRoPE (rope_factors_long/short)")
    return base_config(meta, rope_neox=True, q_prescale=True)


ARCH = register(Arch("phi3", config_from_gguf, ("attn_norm", "attn_output", "ffn_norm", "ffn_up",
                                               "ffn_down")))
