"""What the info routes show of the model, taken once at load: /props, /models and /metrics
answer from it while the model is unloaded (--sleep-idle-seconds), as llama-server's
server_context_meta does."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from edgeinfer.errors import EdgeInferError


@dataclass(frozen=True)
class ModelInfo:
    file_name: str
    vocab_type: int  # llama.cpp's LLAMA_VOCAB_TYPE: 1 SPM, 2 BPE
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_params: int
    size: int  # bytes of the file
    n_ctx: int  # of one slot
    chat_template: str
    bos_token: str
    eos_token: str


def model_info(model, path: Path) -> ModelInfo:
    tok, c = model.tokenizer, model.config

    def text(token_id: int | None) -> str:
        return tok.token_text(token_id) if token_id is not None else ""
    return ModelInfo(path.name, 1 if tok.kind == "spm" else 2, c.n_vocab, c.n_ctx_train,
                     c.n_embd, _n_params(path), _file_size(path), model.transformer.n_ctx,
                     model.chat_template or "", text(tok.bos_id), text(tok.eos_id))


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _n_params(path: Path) -> int:
    from edgeinfer.gguf_file import GGUFFile

    try:
        return sum(math.prod(t.shape) for t in GGUFFile(path).tensors.values())
    except (EdgeInferError, OSError):  # the file changed since it was loaded
        return 0
