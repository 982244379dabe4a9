"""A GGUF model checked in one place before anything is built from it, in llama.cpp's order:

1. the file's structure, while `GGUFFile` reads it (magic, version, counts, key and string
   lengths, value types, alignment, tensor dims and types, offsets inside the file:
   ggml/src/gguf.cpp);
2. the types of the generic metadata keys (`METADATA_TYPES`; llama.cpp refuses a key of the
   wrong type: src/llama-model-loader.cpp, "wrong type");
3. the hyperparameters, while the architecture's `config_from_gguf` reads them
   (`edgeinfer.config.ArchKeys`: ranges, divisibility; src/llama-model.cpp, load_hparams);
4. the tensors against the hyperparameters: the number of blocks and every known tensor's
   exact shape (llama.cpp's create_tensor), so no kernel reads past a weight.

All of it is O(header): tensor data is never touched. `open_model` runs the four steps; the
`info` command and `Model.load` both start with it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config import ModelConfig, describe
from edgeinfer.errors import EdgeInferError, printable
from edgeinfer.gguf_file import GGUFFile

_TOKEN_IDS = ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask", "fim_pre",
              "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep", "prefix", "suffix",
              "middle")
# key -> what its value must be: "string", "integer", "bool", "strings", "integers", "numbers"
METADATA_TYPES: dict[str, str] = {
    "general.architecture": "string",
    "general.name": "string",
    "tokenizer.ggml.model": "string",
    "tokenizer.ggml.pre": "string",
    "tokenizer.chat_template": "string",
    "tokenizer.ggml.tokens": "strings",
    "tokenizer.ggml.merges": "strings",
    "tokenizer.ggml.token_type": "integers",
    "tokenizer.ggml.scores": "numbers",
    "tokenizer.ggml.add_bos_token": "bool",
    "tokenizer.ggml.add_eos_token": "bool",
    "tokenizer.ggml.add_space_prefix": "bool",
    **{f"tokenizer.ggml.{name}_token_id": "integer" for name in _TOKEN_IDS},
}


def _has_type(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "strings":
        return isinstance(value, list)  # the reader's string arrays, and only those
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if not isinstance(value, np.ndarray):
        return False
    return value.dtype.kind in ("iu" if kind == "integers" else "iuf")


def check_metadata(meta: dict[str, Any]) -> None:
    """Step 2: each generic key present has the type its readers expect."""
    for key, kind in METADATA_TYPES.items():
        if key in meta and not _has_type(meta[key], kind):
            article = "an array of " + kind if kind.endswith("s") else "a " + kind
            raise EdgeInferError(
                f"invalid model: '{key}' is {describe(meta[key])}, expected {article}")


def _block_shapes(c: ModelConfig, has_gate: bool) -> dict[str, tuple[int, ...]]:
    q, kv = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    return {
        "attn_norm.weight": (c.n_embd,),
        "attn_q.weight": (q, c.n_embd), "attn_q.bias": (q,),
        "attn_k.weight": (kv, c.n_embd), "attn_k.bias": (kv,),
        "attn_v.weight": (kv, c.n_embd), "attn_v.bias": (kv,),
        "attn_qkv.weight": (q + 2 * kv, c.n_embd),
        "attn_output.weight": (c.n_embd, q), "attn_output.bias": (c.n_embd,),
        "attn_q_norm.weight": (c.head_dim,), "attn_k_norm.weight": (c.head_dim,),
        "post_attention_norm.weight": (c.n_embd,),
        "ffn_norm.weight": (c.n_embd,),
        "ffn_gate.weight": (c.n_ff, c.n_embd),
        "ffn_up.weight": ((1 if has_gate else 2) * c.n_ff, c.n_embd),  # phi3: [gate | up]
        "ffn_down.weight": (c.n_embd, c.n_ff),
        "post_ffw_norm.weight": (c.n_embd,),
    }


_BLOCK_NAME = re.compile(r"blk\.(\d{1,9})\.(.+)")


def check_tensors(gguf: GGUFFile, c: ModelConfig) -> None:
    """Step 4: block_count matches the blocks the tensors hold, and every tensor the model
    reads has the exact shape the hyperparameters give it (missing ones are reported by the
    weight loader, which knows which are optional)."""
    top = {"token_embd.weight": (c.n_vocab, c.n_embd), "output_norm.weight": (c.n_embd,),
           "output.weight": (c.n_vocab, c.n_embd), "output.bias": (c.n_vocab,),
           "rope_freqs.weight": (c.n_rot // 2,)}
    n_blocks = 0
    shapes = {}
    for name, info in gguf.tensors.items():
        match = _BLOCK_NAME.fullmatch(name)
        if match is None:
            want = top.get(name)
        else:
            il = int(match.group(1))
            n_blocks = max(n_blocks, il + 1)
            if il >= c.n_layer:
                continue  # reported below, as a block count mismatch
            if il not in shapes:
                shapes[il] = _block_shapes(c, f"blk.{il}.ffn_gate.weight" in gguf.tensors)
            want = shapes[il].get(match.group(2))
        if want is not None and info.shape != want:
            raise EdgeInferError(f"invalid model: tensor '{printable(name)}' has shape "
                                 f"{info.shape}, expected {want}")
    if n_blocks != c.n_layer:
        raise EdgeInferError(f"invalid model: '{c.arch}.block_count' is {c.n_layer} but the "
                             f"tensors hold {n_blocks} blocks")


def open_model(path: str | Path):
    """The checked (GGUFFile, Arch, ModelConfig) of a model file (steps 1-4)."""
    from edgeinfer.arch import get_arch

    gguf = GGUFFile(path)
    meta = gguf.metadata
    if "general.architecture" not in meta:
        raise EdgeInferError(f"{path}: GGUF file has no 'general.architecture' key")
    check_metadata(meta)
    arch = get_arch(meta["general.architecture"])
    config = arch.config_from_gguf(meta)
    check_tensors(gguf, config)
    return gguf, arch, config
