"""The Python API: `Model.load(path)` then tokenize / detokenize / logits / generate."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from edgeinfer.errors import EdgeInferError
from edgeinfer.process import GcPause, reporting_compiles, set_threads
from edgeinfer.sampling import SamplingParams, make_sampler
from edgeinfer.spec import SpecParams

SAMPLING = SamplingParams()  # generate's defaults
DEFAULT_CTX = 4096  # llama.cpp's default context size, capped at the model's own


class Model:
    """A loaded GGUF model: config, tokenizer, transformer (weights + KV cache), template."""

    def __init__(self, path: Path, config, tokenizer, transformer, chat_template: str | None,
                 chat_template_tool_use: str | None = None):
        self.path, self.config, self.tokenizer = path, config, tokenizer
        self.transformer, self.chat_template = transformer, chat_template
        self.chat_template_tool_use = chat_template_tool_use
        self._drafts: dict = {}  # draft model path -> spec.draft_model.DraftModel
        self._chat = None  # chat.model_chat.ModelChat, built on first use

    @classmethod
    def load(cls, path: str | Path, n_ctx: int = 0, threads: int | None = None,
             n_slots: int = 1, n_batch: int = 512,
             progress: Callable[[str], None] | None = None, flash_attn: bool = False,
             compile_helper: bool = False, gpu_layers: int | str | None = 0,
             notes: Callable[[str], None] | None = None,
             warm_up: bool | None = True, kv_cells: int | None = None) -> Model:
        """Memory-map a GGUF file and get it ready to run. n_ctx 0 means min(4096, the
        model's training context). `progress` receives short status messages; on a first
        run (kernels not yet in Numba's disk cache) one per kernel as it compiles, then a
        summary starting with COMPILED. flash_attn: llama.cpp's -fa on attention numerics.
        compile_helper: on a first run, a second process compiles kernels meanwhile
        (kernels/precompile.py; the CLI's choice). gpu_layers: llama.cpp's -ngl, a count,
        'all' or 'auto' (the `cuda` extra); without a CUDA device the model runs on the CPU.
        `notes` receives the lines worth keeping: where the layers went, or why not.
        warm_up: run a prefill and a decode step before returning, so the first request
        pays no kernel load (a server's choice); None: only when kernels had to be compiled
        (a cold cache: compiled under the progress messages, not at the first token).
        kv_cells: None, each of the n_slots slots has n_ctx cells of its own; else the KV
        cache is one pool of blocks for the caller to hand out (edgeinfer/kv/), of kv_cells
        cells (0: n_slots x n_ctx), n_ctx then each sequence's limit (at most kv_cells)."""
        from edgeinfer.kernels import precompile

        helper, cold = [], []

        with GcPause() as pause:
            def on_compile() -> None:  # the first compile: the cache is cold
                cold.append(True)
                pause.resume()
                if compile_helper:
                    helper.append(precompile.start(path, flash_attn))

            try:
                return cls._load(path, n_ctx, threads, n_slots, n_batch, progress,
                                 on_compile, flash_attn, gpu_layers, notes,
                                 lambda: warm_up or (warm_up is None and bool(cold)), kv_cells)
            finally:
                for child in helper:
                    precompile.stop(child)

    @classmethod
    def _load(cls, path, n_ctx, threads, n_slots, n_batch, progress, on_compile,
              flash_attn, gpu_layers=0, notes=None, warm_up=lambda: True,
              kv_cells=None) -> Model:
        from edgeinfer.cuda.placement import parse_gpu_layers, place
        from edgeinfer.model import Transformer, block_size
        from edgeinfer.tokenizer import Tokenizer
        from edgeinfer.validate import open_model
        from edgeinfer.weights import load_weights

        gguf, arch, config = open_model(path)
        meta = gguf.metadata
        set_threads(threads)
        weights = load_weights(gguf, config, arch)
        tokenizer = Tokenizer.from_metadata(meta)
        n_ctx = n_ctx or min(DEFAULT_CTX, config.n_ctx_train)
        kv_blocks = 0
        if kv_cells is not None:
            kv_cells = kv_cells or n_slots * n_ctx
            n_ctx = min(n_ctx, kv_cells)
            kv_blocks = -(-kv_cells // block_size(n_ctx))
        if n_ctx < 8:
            raise EdgeInferError(f"context size {n_ctx} is too small")
        kv_size = ((kv_blocks * block_size(n_ctx), 1) if kv_blocks  # (cells, sequences)
                   else (n_ctx, n_slots))
        placement = place(parse_gpu_layers(gpu_layers), config, weights, *kv_size, n_batch)
        for line in placement.notes:
            (notes or (lambda line: None))(line)
        with reporting_compiles(progress or (lambda message: None), on_compile):
            transformer = Transformer(config, weights, n_ctx, n_slots, n_batch, flash_attn,
                                      placement.n_gpu, kv_blocks)
            model = cls(Path(path), config, tokenizer, transformer,
                        meta.get("tokenizer.chat_template"),
                        meta.get("tokenizer.chat_template.tool_use"))
            if warm_up():
                model._warm_up()
        return model

    def _warm_up(self) -> None:
        """Run a prefill-sized and a one-token forward so every kernel variant is compiled
        (or loaded from Numba's on-disk cache) before the first real token."""
        from edgeinfer.kernels.ops import PARALLEL_ROWS

        device = self.transformer.device
        if device is not None and device.simulated:  # the simulator compiles nothing
            return
        tables = self.transformer.kv_cache.tables
        row = tables[0].copy()
        if row[0] < 0:  # a pool whose blocks are not handed out yet: borrow the first ones
            tables[0] = np.arange(len(row))
        self.logits([0] * min(PARALLEL_ROWS, self.transformer.n_ctx), rows=[0])
        self.logits([0])
        tables[0] = row

    # -- tokens ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    @property
    def chat(self):
        """The model's chat-prompt path (chat.model_chat.ModelChat), built on first use with
        the settings table's defaults, as `edgeinfer serve` builds its own."""
        if self._chat is None:
            from edgeinfer.chat.model_chat import load_chat

            self._chat = load_chat(self)
        return self._chat

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **extra) -> str:
        """The prompt `messages` (OpenAI chat messages) make, as the server's /apply-template
        renders it: the model's template (ChatML when it has none) with llama.cpp's message
        shaping, date context and reasoning arguments, minus a leading BOS that tokenization
        adds again. `extra`: `tools`, `tool_choice` and the other chat request fields
        (chat.model_chat.REQUEST_FIELDS); any other keyword is a template variable
        (chat_template_kwargs, e.g. enable_thinking=False). Bad messages raise
        EdgeInferError."""
        return self.chat.apply(messages, add_generation_prompt, **extra)

    # -- compute --------------------------------------------------------------------------
    def logits(self, ids: Sequence[int], slot: int = 0,
               rows: Sequence[int] | None = None) -> np.ndarray:
        """Logits (len(ids), n_vocab) of every position, on a fresh context in `slot`; with
        `rows`, only those positions' logits (len(rows), n_vocab), skipping the others'
        output projection (the largest matrix of small models)."""
        n = len(ids)
        if n > self.transformer.n_ctx:
            raise EdgeInferError(f"{n} tokens exceed the context size {self.transformer.n_ctx}")
        positions = np.arange(n, dtype=np.int32)
        wanted = positions if rows is None else np.asarray(rows, dtype=np.int32)
        out = np.zeros((len(wanted), self.config.n_vocab), dtype=np.float32)
        self.transformer.forward(np.asarray(ids, dtype=np.int32), positions,
                                 np.full(n, slot, np.int32), wanted, out)
        return out

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128,
                 temperature: float = SAMPLING.temperature, top_k: int = SAMPLING.top_k,
                 top_p: float = SAMPLING.top_p, min_p: float = SAMPLING.min_p,
                 repeat_penalty: float = SAMPLING.repeat_penalty,
                 repeat_last_n: int = SAMPLING.repeat_last_n,
                 presence_penalty: float = SAMPLING.presence_penalty,
                 frequency_penalty: float = SAMPLING.frequency_penalty,
                 seed: int | None = SAMPLING.seed, stop: Sequence[str] = (),
                 grammar: str | None = None,
                 json_schema: dict | str | None = None,
                 spec: SpecParams | None = None) -> Iterator[str]:
        """Yield generated text pieces (a prompt string is tokenized with special tokens).
        max_tokens -1 generates until EOS or the end of the context (the CLI's and the
        server's default, N_PREDICT); the sampling defaults are `SamplingParams()`'s.
        `grammar` (GBNF, or Lark after `%llguidance`) or `json_schema` constrains the output
        (the `structured` extra); a grammar or schema that does not compile raises
        EdgeInferError saying why. `spec` (edgeinfer.spec.SpecParams): speculative decoding,
        e.g. SpecParams("ngram-simple"); the same text, sooner where it copies the prompt."""
        from edgeinfer.generate import stream_generate

        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        constraint = self.compile_constraint(grammar, json_schema)
        sampler = make_sampler(SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed))
        for event in stream_generate(self, ids, sampler, max_tokens, stop,
                                     constraint=constraint, spec=spec):
            if event.text:
                yield event.text

    def draft_model(self, spec: SpecParams | None, threads: int | None = None):
        """The draft model spec names (loaded on first use, a KV slot per slot of this
        model's), or None when it names none. EdgeInferError if it cannot draft for this
        model."""
        if spec is None or spec.type != "draft-simple" or not spec.enabled:
            return None
        draft = self._drafts.get(spec.draft_model)
        if draft is None:
            from edgeinfer.spec.draft_model import DraftModel

            draft = DraftModel.load(spec.draft_model, self, self.transformer.kv_cache.n_slots,
                                    threads)
            self._drafts[spec.draft_model] = draft
        return draft

    def compile_constraint(self, grammar: str | None = None,
                           json_schema: dict | str | None = None):
        """`grammar` or `json_schema` (at most one) compiled for this vocabulary
        (structured.CompiledConstraint, whose `start()` is a sequence's state), or None."""
        if grammar is None and json_schema is None:
            return None
        if grammar is not None and json_schema is not None:
            raise EdgeInferError("give a grammar or a JSON schema, not both")
        from edgeinfer.structured import Constraint, compile_constraint

        spec = Constraint.from_llama_grammar(grammar) if grammar is not None \
            else Constraint.json_schema(json_schema)
        return compile_constraint(self.tokenizer, spec)

    def constraint(self, grammar: str | None = None, json_schema: dict | str | None = None):
        """A new sequence's state for `grammar` or `json_schema` (at most one), or None."""
        compiled = self.compile_constraint(grammar, json_schema)
        return None if compiled is None else compiled.start()
