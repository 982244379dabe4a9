"""Model weights as zero-copy views of the GGUF map, named as GGUF names them.

Fused tensors become row views of the fused matrix (phi3 `attn_qkv` -> q/k/v, `ffn_up` of
2*n_ff rows -> gate/up), so the forward pass sees one layout for every family.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from edgeinfer.arch import Arch
from edgeinfer.config import ModelConfig
from edgeinfer.errors import EdgeInferError
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.kernels.ops import embed_f16, embed_q8_0
from edgeinfer.linear import Linear


@dataclass(frozen=True)
class BlockWeights:
    attn_norm: np.ndarray  # (n_embd,)
    attn_q: Linear  # (n_head*hd, n_embd)
    attn_k: Linear  # (n_kv*hd, n_embd)
    attn_v: Linear  # (n_kv*hd, n_embd)
    attn_output: Linear  # (n_embd, n_head*hd)
    ffn_norm: np.ndarray  # (n_embd,)
    ffn_gate: Linear  # (n_ff, n_embd)
    ffn_up: Linear  # (n_ff, n_embd)
    ffn_down: Linear  # (n_embd, n_ff)
    attn_q_bias: np.ndarray | None = None
    attn_k_bias: np.ndarray | None = None
    attn_v_bias: np.ndarray | None = None
    attn_output_bias: np.ndarray | None = None
    attn_q_norm: np.ndarray | None = None  # (hd,) qwen3, gemma3
    attn_k_norm: np.ndarray | None = None
    post_attention_norm: np.ndarray | None = None  # (n_embd,) gemma3
    post_ffw_norm: np.ndarray | None = None


@dataclass(frozen=True)
class Embedding:
    """token_embd rows, dequantized on lookup (the table stays quantized)."""

    qtype: int
    table: np.ndarray  # (n_vocab, row_bytes) uint8, or (n_vocab, n_embd) float

    def lookup(self, tokens: np.ndarray, out: np.ndarray) -> None:
        if self.qtype == GGMLQuantizationType.Q8_0:
            embed_q8_0(self.table, tokens, out)
        elif self.qtype == GGMLQuantizationType.F16:
            embed_f16(self.table.view(np.uint16), tokens, out)
        elif self.qtype == GGMLQuantizationType.F32:
            out[:] = self.table[tokens]
        elif self.qtype == GGMLQuantizationType.BF16:  # bf16 is the top half of an f32
            out[:] = (self.table[tokens].astype(np.uint32) << 16).view(np.float32)
        else:
            out[:] = dequantize(self.table[tokens], GGMLQuantizationType(self.qtype))


@dataclass(frozen=True)
class Weights:
    token_embd: Embedding
    output_norm: np.ndarray  # (n_embd,)
    output: Linear  # (n_vocab, n_embd): `output.weight`, or token_embd when tied
    blocks: tuple[BlockWeights, ...]
    output_bias: np.ndarray | None = None  # (n_vocab,) qwen2
    rope_freqs: np.ndarray | None = None  # (n_rot/2,) llama3 rope scaling factors


COMMON_BLOCK = ("attn_norm", "attn_q+attn_k+attn_v or attn_qkv", "attn_output", "ffn_norm",
                "ffn_gate+ffn_up or fused ffn_up", "ffn_down")


class _Loader:
    def __init__(self, gguf: GGUFFile, config: ModelConfig, arch: Arch):
        self.gguf, self.config, self.arch = gguf, config, arch

    def missing(self, name: str) -> EdgeInferError:
        needs = list(dict.fromkeys(COMMON_BLOCK + self.arch.block_tensors))
        return EdgeInferError(
            f"unsupported tensor layout: missing tensor '{name}' (a {self.arch.name} model "
            f"has token_embd, output_norm and per block: {', '.join(needs)})")

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def vector(self, name: str, required: bool = True) -> np.ndarray | None:
        if not self.has(name):
            if required:
                raise self.missing(name)
            return None
        info = self.gguf.tensors[name]
        if info.qtype not in (0, 1):
            raise EdgeInferError(f"tensor '{name}' has unsupported type {info.type_name}")
        # a small writable copy: the layer loop's norms and biases are copies (layers.stack),
        # so the kernels see one array type and compile once
        return np.array(self.gguf.tensor(name), dtype=np.float32).reshape(-1)

    def linear(self, name: str, n_out: int | None = None) -> Linear:
        if not self.has(name):
            raise self.missing(name)
        info = self.gguf.tensors[name]
        if len(info.shape) != 2:
            raise EdgeInferError(f"unsupported tensor layout: '{name}' has shape {info.shape}")
        lin = Linear.from_tensor(name, info.qtype, self.gguf.tensor(name), info.shape)
        if n_out is not None and lin.n_out != n_out:
            raise EdgeInferError(
                f"unsupported tensor layout: '{name}' has {lin.n_out} rows, expected {n_out}"
            )
        return lin


def load_weights(gguf: GGUFFile, config: ModelConfig, arch: Arch) -> Weights:
    ld = _Loader(gguf, config, arch)
    embd_info = gguf.tensors.get("token_embd.weight")
    if embd_info is None:
        raise ld.missing("token_embd.weight")
    output_name = "output.weight" if ld.has("output.weight") else "token_embd.weight"
    output = ld.linear(output_name, config.n_vocab).for_logits()
    return Weights(
        token_embd=Embedding(embd_info.qtype, gguf.tensor("token_embd.weight")),
        output_norm=ld.vector("output_norm.weight"),
        output=output,
        blocks=tuple(_load_block(ld, arch, il) for il in range(config.n_layer)),
        output_bias=ld.vector("output.bias", required=False),
        rope_freqs=ld.vector("rope_freqs.weight", required=False),
    )


def _load_block(ld: _Loader, arch: Arch, il: int) -> BlockWeights:
    cfg = ld.config
    p = f"blk.{il}."
    for name in arch.block_tensors:
        if not ld.has(f"{p}{name}.weight"):
            raise ld.missing(f"{p}{name}.weight")
    q_rows, kv_rows = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    if ld.has(f"{p}attn_qkv.weight"):
        qkv = ld.linear(f"{p}attn_qkv.weight", q_rows + 2 * kv_rows)
        q = qkv.rows(0, q_rows, f"{p}attn_q")
        k = qkv.rows(q_rows, q_rows + kv_rows, f"{p}attn_k")
        v = qkv.rows(q_rows + kv_rows, q_rows + 2 * kv_rows, f"{p}attn_v")
    else:
        q = ld.linear(f"{p}attn_q.weight", q_rows)
        k = ld.linear(f"{p}attn_k.weight", kv_rows)
        v = ld.linear(f"{p}attn_v.weight", kv_rows)
    if ld.has(f"{p}ffn_gate.weight"):
        gate, up = ld.linear(f"{p}ffn_gate.weight", cfg.n_ff), ld.linear(f"{p}ffn_up.weight")
    else:  # phi3: ffn_up holds [gate | up]
        fused = ld.linear(f"{p}ffn_up.weight", 2 * cfg.n_ff)
        gate = fused.rows(0, cfg.n_ff, f"{p}ffn_gate")
        up = fused.rows(cfg.n_ff, 2 * cfg.n_ff, f"{p}ffn_up")
    def opt(name):
        return ld.vector(f"{p}{name}", required=False)

    return BlockWeights(
        attn_norm=ld.vector(f"{p}attn_norm.weight"),
        attn_q=q, attn_k=k, attn_v=v,
        attn_output=ld.linear(f"{p}attn_output.weight", cfg.n_embd),
        ffn_norm=ld.vector(f"{p}ffn_norm.weight"),
        ffn_gate=gate, ffn_up=up,
        ffn_down=ld.linear(f"{p}ffn_down.weight", cfg.n_embd),
        attn_q_bias=opt("attn_q.bias"), attn_k_bias=opt("attn_k.bias"),
        attn_v_bias=opt("attn_v.bias"), attn_output_bias=opt("attn_output.bias"),
        attn_q_norm=opt("attn_q_norm.weight"), attn_k_norm=opt("attn_k_norm.weight"),
        post_attention_norm=opt("post_attention_norm.weight"),
        post_ffw_norm=opt("post_ffw_norm.weight"),
    )
