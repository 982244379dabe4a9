"""Tiny random GGUF models written with gguf.GGUFWriter, one per architecture and quant type.

Tensor names and metadata keys follow what llama.cpp's converter writes (gguf-py MODEL_TENSORS
and Keys). The vocabulary is a small GPT-2 byte-level BPE with ChatML special tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants
from gguf import GGMLQuantizationType as Q

KQUANT_SCALE = {  # (offset of the f16 d field, d) per k-quant type, keeping values ~0.1
    Q.Q2_K: ((80, 82), 2e-3), Q.Q3_K: ((108,), 5e-4), Q.Q4_K: ((0, 2), 1e-4),
    Q.Q5_K: ((0, 2), 5e-5), Q.Q6_K: ((208,), 2e-5),
}
BLOCK_BYTES = {Q.Q2_K: 84, Q.Q3_K: 110, Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}


def bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character map, in byte order."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s"]
CHATML = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + "
          "'<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{'<|im_start|>assistant\n'}}{% endif %}")


def vocab() -> list[str]:
    merged = ["".join(m.split(" ")) for m in MERGES]
    return SPECIALS + bytes_to_unicode() + merged


QUANTIZABLE = {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1}


def random_weight(rng, shape, qtype) -> np.ndarray:
    """Random weights ~N(0, 0.1) in the given type, as raw data GGUFWriter accepts."""
    n_out, n_in = shape
    if qtype in BLOCK_BYTES:
        raw = rng.integers(0, 256, size=(n_out, n_in // 256 * BLOCK_BYTES[qtype]), dtype=np.uint8)
        blocks = raw.reshape(n_out, -1, BLOCK_BYTES[qtype])
        offsets, d = KQUANT_SCALE[qtype]
        for off in offsets:
            scale = (rng.uniform(0.5, 1.5, blocks.shape[:2]) * d).astype(np.float16)
            blocks[:, :, off : off + 2] = scale.view(np.uint8).reshape(*blocks.shape[:2], 2)
        return raw
    if qtype not in QUANTIZABLE:  # a type we do not run: right size, content irrelevant
        block, size = GGML_QUANT_SIZES[qtype]
        return np.zeros((n_out, n_in // block * size), dtype=np.uint8)
    x = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    if qtype == Q.F32:
        return x
    return quants.quantize(x, qtype)


ARCH_EXTRAS = {"llama", "qwen2", "qwen3", "phi3", "gemma3"}


def write_tiny_model(path: Path, arch: str = "llama", qtype: Q = Q.Q8_0, seed: int = 0, *,
                     n_embd: int = 256, n_ff: int = 512, n_layer: int = 2, n_head: int = 4,
                     n_kv: int = 2, head_dim: int = 64, tied: bool = True,
                     window: int = 4, n_ctx_train: int = 512,
                     llama_sliding_window: bool = False,
                     chat_template: str | None = CHATML) -> Path:
    """Write a random model of `arch` whose matrices are `qtype` (norms stay F32), with
    `chat_template` as tokenizer.chat_template (None: no template)."""
    assert arch in ARCH_EXTRAS
    rng = np.random.default_rng(seed)
    tokens = vocab()
    n_vocab = len(tokens)
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}-{qtype.name}")
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if arch == "gemma3" or llama_sliding_window:  # Mistral files may carry the key too
        w.add_sliding_window(window)
    if arch == "gemma3":
        w.add_uint32("gemma3.attention.sliding_window_pattern", 2)
    _add_tokenizer(w, tokens, chat_template)

    def mat(name, n_out, n_in, t=qtype):
        w.add_tensor(name, random_weight(rng, (n_out, n_in), t), raw_dtype=t)

    def vec(name, n, offset=1.0):
        w.add_tensor(name, (offset + 0.1 * rng.standard_normal(n)).astype(np.float32))

    mat("token_embd.weight", n_vocab, n_embd, qtype if qtype in QUANTIZABLE else Q.Q8_0)
    vec("output_norm.weight", n_embd)
    if not tied:
        mat("output.weight", n_vocab, n_embd)
    q_rows, kv_rows = n_head * head_dim, n_kv * head_dim
    for il in range(n_layer):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", n_embd)
        vec(p + "ffn_norm.weight", n_embd)
        if arch == "phi3":
            mat(p + "attn_qkv.weight", q_rows + 2 * kv_rows, n_embd)
            mat(p + "ffn_up.weight", 2 * n_ff, n_embd)
        else:
            mat(p + "attn_q.weight", q_rows, n_embd)
            mat(p + "attn_k.weight", kv_rows, n_embd)
            mat(p + "attn_v.weight", kv_rows, n_embd)
            mat(p + "ffn_gate.weight", n_ff, n_embd)
            mat(p + "ffn_up.weight", n_ff, n_embd)
        mat(p + "attn_output.weight", n_embd, q_rows)
        mat(p + "ffn_down.weight", n_embd, n_ff)
        if arch == "qwen2":
            for c, n in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
                vec(f"{p}attn_{c}.bias", n, 0.0)
        if arch in ("qwen3", "gemma3"):
            vec(p + "attn_q_norm.weight", head_dim)
            vec(p + "attn_k_norm.weight", head_dim)
        if arch == "gemma3":
            vec(p + "post_attention_norm.weight", n_embd)
            vec(p + "post_ffw_norm.weight", n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _add_tokenizer(w: GGUFWriter, tokens: list[str], chat_template: str | None) -> None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
