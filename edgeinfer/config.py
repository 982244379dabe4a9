"""The one frozen model configuration, built from GGUF metadata.

Only `base_config` (generic `{arch}.*` keys, docs/architecture.md "GGUF metadata") and each
architecture's `config_from_gguf` hook read metadata; everything downstream takes this object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.errors import EdgeInferError


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    name: str
    n_vocab: int  # length of tokenizer.ggml.tokens, not {arch}.vocab_size (llama.cpp does so)
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_rot: int
    norm_eps: float
    rope_neox: bool  # False: rotate adjacent pairs (llama); True: half split
    rope_base: float
    rope_freq_scale: float = 1.0
    rope_base_swa: float = 10000.0  # rope base of sliding-window layers (gemma3)
    sliding_window: int = 0  # keys visible on SWA layers, the current one included; 0 = none
    swa_layers: tuple[bool, ...] = field(default=())  # per layer: uses the sliding window
    attn_scale: float = 0.0  # 0 -> 1/sqrt(head_dim)
    q_prescale: bool = False  # scale Q in f32 before attention (phi3, gemma3) vs inside softmax
    embd_scale: float = 1.0  # gemma3: sqrt(n_embd)
    ffn_act: str = "silu"  # "silu" or "gelu_tanh"
    final_softcap: float = 0.0

    def __post_init__(self) -> None:
        if not self.swa_layers:
            object.__setattr__(self, "swa_layers", (False,) * self.n_layer)
        if self.attn_scale == 0.0:
            object.__setattr__(self, "attn_scale", 1.0 / math.sqrt(self.head_dim))
        if self.n_head % self.n_head_kv:
            raise EdgeInferError(
                f"invalid model: {self.n_head} heads not divisible by {self.n_head_kv} KV heads"
            )

    def kv_cache_bytes(self, n_ctx: int, n_slots: int = 1) -> int:
        """F16 K and V for every layer."""
        return 2 * 2 * self.n_layer * n_slots * n_ctx * self.n_head_kv * self.head_dim


def meta_get(meta: dict[str, Any], key: str, default: Any = None, *, required: bool = False):
    if key in meta:
        return meta[key]
    if required:
        raise EdgeInferError(f"GGUF metadata is missing the required key '{key}'")
    return default


def per_layer_scalar(value: Any, key: str) -> int:
    """Head counts and n_ff may be per-layer arrays; we support the uniform case."""
    if hasattr(value, "__len__") and not isinstance(value, str):
        values = {int(v) for v in value}
        if len(values) != 1:
            raise EdgeInferError(f"unsupported tensor layout: per-layer '{key}' values {values}")
        return values.pop()
    return int(value)


def base_config(meta: dict[str, Any], **overrides: Any) -> ModelConfig:
    """ModelConfig from the generic keys every family shares; `overrides` are the
    architecture's own fields."""
    arch = meta["general.architecture"]

    def key(name: str, default: Any = None, required: bool = False) -> Any:
        return meta_get(meta, f"{arch}.{name}", default, required=required)

    n_embd = int(key("embedding_length", required=True))
    n_head = per_layer_scalar(key("attention.head_count", required=True), "head_count")
    n_head_kv = per_layer_scalar(key("attention.head_count_kv", n_head), "head_count_kv")
    head_dim = int(key("attention.key_length", n_embd // n_head))
    tokens = meta.get("tokenizer.ggml.tokens")
    scale_type = key("rope.scaling.type", "linear")
    factor = float(key("rope.scaling.factor", key("rope.scale_linear", 1.0)) or 1.0)
    if scale_type not in ("none", "linear"):
        raise EdgeInferError(f"unsupported rope scaling type '{scale_type}' (supported: linear)")
    fields: dict[str, Any] = dict(
        arch=arch,
        name=str(meta.get("general.name", arch)),
        n_vocab=len(tokens) if tokens is not None else int(key("vocab_size", required=True)),
        n_ctx_train=int(key("context_length", required=True)),
        n_embd=n_embd,
        n_layer=int(key("block_count", required=True)),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=per_layer_scalar(key("feed_forward_length", 0), "feed_forward_length"),
        n_rot=int(key("rope.dimension_count", head_dim)),
        norm_eps=float(key("attention.layer_norm_rms_epsilon", required=True)),
        rope_neox=True,
        rope_base=float(key("rope.freq_base", 10000.0)),
        rope_freq_scale=1.0 if scale_type == "none" else 1.0 / factor,
    )
    fields.update(overrides)
    return ModelConfig(**fields)
