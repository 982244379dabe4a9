"""The one frozen model configuration, built from GGUF metadata.

Only `base_config` (generic `{arch}.*` keys, docs/architecture.md "GGUF metadata") and each
architecture's `config_from_gguf` hook read metadata; everything downstream takes this object.
They read it through `ArchKeys`, which checks each value's type and range as llama.cpp's
load_hparams does (src/llama-model.cpp), so no count is 0 before it divides and no size is
absurd before it allocates; an error names the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeinfer.errors import EdgeInferError, printable

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS, src/llama-hparams.h
MAX_DIM = 1 << 20  # embedding, feed-forward and head sizes: far above any model's
MAX_HEADS = 1 << 12
MAX_CTX = 1 << 30
MAX_VOCAB = 2**31 - 1  # token ids are int32


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
        if len(self.swa_layers) != self.n_layer:
            raise EdgeInferError(f"invalid model: a sliding-window pattern of "
                                 f"{len(self.swa_layers)} layers for {self.n_layer} layers")

    def kv_cache_bytes(self, n_ctx: int, n_slots: int = 1) -> int:
        """F16 K and V for every layer."""
        return 2 * 2 * self.n_layer * n_slots * n_ctx * self.n_head_kv * self.head_dim


def describe(value: Any) -> str:
    """A metadata value as an error message shows it: short, whatever its size."""
    if isinstance(value, str):
        return f"the string '{printable(value, 40)}'"
    if isinstance(value, (list, np.ndarray)):
        return f"an array of {len(value)} values"
    return printable(repr(value), 40)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_number(value: Any) -> bool:
    return _is_int(value) or isinstance(value, (float, np.floating))


class ArchKeys:
    """Typed, range-checked reads of `{arch}.*` metadata; each failure names its key."""

    def __init__(self, meta: dict[str, Any], arch: str):
        self.meta, self.arch = meta, arch

    def get(self, name: str, default: Any = None, required: bool = False) -> Any:
        key = f"{self.arch}.{name}"
        if key in self.meta:
            return self.meta[key]
        if required:
            raise EdgeInferError(f"GGUF metadata is missing the required key '{key}'")
        return default

    def fail(self, name: str, value: Any, expected: str) -> EdgeInferError:
        return EdgeInferError(
            f"invalid model: '{self.arch}.{name}' is {describe(value)}, expected {expected}")

    def int(self, name: str, default: Any = None, lo: int = 1, hi: int = MAX_DIM,
            required: bool = False) -> int:
        value = self.get(name, default, required)
        if not _is_int(value) or not lo <= value <= hi:
            raise self.fail(name, value, f"an integer in [{lo}, {hi}]")
        return int(value)

    def float(self, name: str, default: Any = None, positive: bool = True,
              required: bool = False) -> float:
        value = self.get(name, default, required)
        ok = _is_number(value) and math.isfinite(value) and (value > 0 or
                                                             (not positive and value >= 0))
        if not ok:
            raise self.fail(name, value, "a finite number " + ("> 0" if positive else ">= 0"))
        return float(value)

    def per_layer(self, name: str, n_layer: int, default: Any = None, lo: int = 1,
                  hi: int = MAX_DIM, required: bool = False) -> int:
        """Head counts and n_ff may be per-layer arrays; we support the uniform case."""
        value = self.get(name, default, required)
        if not isinstance(value, np.ndarray):
            return self.int(name, default, lo, hi, required)
        if len(value) != n_layer or value.dtype.kind not in "iu":
            raise self.fail(name, value, f"an integer or {n_layer} integers, one per layer")
        values = {int(v) for v in value}
        if len(values) != 1:
            raise EdgeInferError(
                f"unsupported tensor layout: per-layer '{self.arch}.{name}' values "
                f"{printable(sorted(values), 60)}")
        uniform = values.pop()
        if not lo <= uniform <= hi:
            raise self.fail(name, uniform, f"an integer in [{lo}, {hi}]")
        return uniform


def n_vocab_of(meta: dict[str, Any], keys: ArchKeys) -> int:
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        return keys.int("vocab_size", lo=1, hi=MAX_VOCAB, required=True)
    if not isinstance(tokens, list) or not 1 <= len(tokens) <= MAX_VOCAB:
        raise EdgeInferError(f"invalid model: 'tokenizer.ggml.tokens' is {describe(tokens)}, "
                             "expected an array of strings")
    return len(tokens)


def base_config(meta: dict[str, Any], **overrides: Any) -> ModelConfig:
    """ModelConfig from the generic keys every family shares, read and checked in
    llama.cpp's load_hparams order; `overrides` are the architecture's own fields."""
    arch = meta["general.architecture"]
    keys = ArchKeys(meta, arch)
    n_ctx_train = keys.int("context_length", hi=MAX_CTX, required=True)
    n_embd = keys.int("embedding_length", required=True)
    n_layer = keys.int("block_count", hi=MAX_LAYERS, required=True)
    n_ff = keys.per_layer("feed_forward_length", n_layer, required=True)
    n_head = keys.per_layer("attention.head_count", n_layer, hi=MAX_HEADS, required=True)
    n_head_kv = keys.per_layer("attention.head_count_kv", n_layer, n_head, hi=n_head)
    rope_base = keys.float("rope.freq_base", 10000.0)
    scale_type = keys.get("rope.scaling.type", "linear")
    if not isinstance(scale_type, str) or scale_type not in ("none", "linear"):
        raise EdgeInferError(f"unsupported rope scaling type: '{arch}.rope.scaling.type' is "
                             f"{describe(scale_type)} (supported: linear)")
    old_factor = keys.float("rope.scale_linear", 0.0, positive=False)
    factor = keys.float("rope.scaling.factor", old_factor, positive=False) or 1.0
    if keys.get("attention.key_length") is None and n_embd % n_head:
        raise EdgeInferError(f"invalid model: '{arch}.embedding_length' {n_embd} is not "
                             f"divisible by '{arch}.attention.head_count' {n_head}")
    head_dim = keys.int("attention.key_length", n_embd // n_head)
    value_dim = keys.int("attention.value_length", head_dim)
    if value_dim != head_dim:
        raise EdgeInferError(f"unsupported model: value head size {value_dim} differs from "
                             f"the key head size {head_dim}")
    n_rot = keys.int("rope.dimension_count", head_dim, hi=head_dim)
    if n_rot % 2:
        raise EdgeInferError(f"invalid model: '{arch}.rope.dimension_count' {n_rot} is odd")
    name = meta.get("general.name", arch)
    fields: dict[str, Any] = dict(
        arch=arch,
        name=name if isinstance(name, str) else arch,
        n_vocab=n_vocab_of(meta, keys),
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=n_ff,
        n_rot=n_rot,
        norm_eps=keys.float("attention.layer_norm_rms_epsilon", required=True),
        rope_neox=True,
        rope_base=rope_base,
        rope_freq_scale=1.0 if scale_type == "none" else 1.0 / factor,
    )
    fields.update(overrides)
    return ModelConfig(**fields)
