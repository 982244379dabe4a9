"""The Python API: `Model.load(path)` then tokenize / detokenize / logits / generate."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from edgeinfer.errors import EdgeInferError
from edgeinfer.sampling import SamplingParams, make_sampler

SAMPLING = SamplingParams()  # generate's defaults
DEFAULT_CTX = 4096  # llama.cpp's default context size, capped at the model's own


class Model:
    """A loaded GGUF model: config, tokenizer, transformer (weights + KV cache), template."""

    def __init__(self, path: Path, config, tokenizer, transformer, chat_template: str | None):
        self.path, self.config, self.tokenizer = path, config, tokenizer
        self.transformer, self.chat_template = transformer, chat_template

    @classmethod
    def load(cls, path: str | Path, n_ctx: int = 0, threads: int | None = None,
             n_slots: int = 1, n_batch: int = 512,
             progress: Callable[[str], None] | None = None, flash_attn: bool = False,
             compile_helper: bool = False) -> Model:
        """Memory-map a GGUF file and get it ready to run. n_ctx 0 means min(4096, the
        model's training context). `progress` receives short status messages; on a first
        run (kernels not yet in Numba's disk cache) one per kernel as it compiles, then a
        summary starting with COMPILED. flash_attn: llama.cpp's -fa on attention numerics.
        compile_helper: on a first run, a second process compiles kernels meanwhile
        (kernels/precompile.py; the CLI's choice)."""
        from edgeinfer.kernels import precompile

        helper = []

        with _GcPause() as pause:
            def on_compile() -> None:  # the first compile: the cache is cold
                pause.resume()
                if compile_helper:
                    helper.append(precompile.start(path, flash_attn))

            try:
                return cls._load(path, n_ctx, threads, n_slots, n_batch, progress,
                                 on_compile, flash_attn)
            finally:
                for child in helper:
                    precompile.stop(child)

    @classmethod
    def _load(cls, path, n_ctx, threads, n_slots, n_batch, progress, on_compile,
              flash_attn) -> Model:
        from edgeinfer.arch import get_arch
        from edgeinfer.gguf_file import GGUFFile
        from edgeinfer.model import Transformer
        from edgeinfer.tokenizer import Tokenizer
        from edgeinfer.weights import load_weights

        gguf = GGUFFile(path)
        meta = gguf.metadata
        if "general.architecture" not in meta:
            raise EdgeInferError(f"{path}: GGUF file has no 'general.architecture' key")
        arch = get_arch(meta["general.architecture"])
        config = arch.config_from_gguf(meta)
        set_threads(threads)
        weights = load_weights(gguf, config, arch)
        tokenizer = Tokenizer.from_metadata(meta)
        n_ctx = n_ctx or min(DEFAULT_CTX, config.n_ctx_train)
        if n_ctx < 8:
            raise EdgeInferError(f"context size {n_ctx} is too small")
        with reporting_compiles(progress or (lambda message: None), on_compile):
            transformer = Transformer(config, weights, n_ctx, n_slots, n_batch, flash_attn)
            model = cls(Path(path), config, tokenizer, transformer,
                        meta.get("tokenizer.chat_template"))
            model._warm_up()
        return model

    def _warm_up(self) -> None:
        """Run a prefill-sized and a one-token forward so every kernel variant is compiled
        (or loaded from Numba's on-disk cache) before the first real token."""
        from edgeinfer.kernels.ops import PARALLEL_ROWS

        self.logits([0] * min(PARALLEL_ROWS, self.transformer.n_ctx), rows=[0])
        self.logits([0])

    # -- tokens ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **extra) -> str:
        """Render messages with the model's template (ChatML when it has none), minus a
        leading BOS that tokenization adds again (llama.cpp common/chat.cpp)."""
        from edgeinfer.chat import render_chat

        tok = self.tokenizer
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
        return render_chat(self.chat_template, messages,
                           add_generation_prompt=add_generation_prompt, bos_token=bos,
                           eos_token=eos, strip_bos=tok.add_bos, **extra)

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
                 seed: int | None = SAMPLING.seed, stop: Sequence[str] = ()) -> Iterator[str]:
        """Yield generated text pieces (a prompt string is tokenized with special tokens).
        max_tokens -1 generates until EOS or the end of the context (the CLI's and the
        server's default, N_PREDICT); the sampling defaults are `SamplingParams()`'s."""
        from edgeinfer.generate import stream_generate

        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        sampler = make_sampler(SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed))
        for event in stream_generate(self, ids, sampler, max_tokens, stop):
            if event.text:
                yield event.text


COMPILING = "compiling kernels (first run only; cached afterwards)"
COMPILED = "compiled"  # the summary: "compiled 154 kernels in 39.7 s (cached for next runs)"


@contextmanager
def reporting_compiles(progress: Callable[[str], None],
                       on_first: Callable[[], None] | None = None) -> Iterator[None]:
    """Name each kernel as Numba compiles it, then say how long compiling took. Numba raises
    its "numba:compile" event (numba.core.event) only on a cache miss, so a warm start says
    nothing. Messages read COMPILING + ": module.kernel". `on_first` runs at the first
    compile. The listener is process-wide: concurrent loads would see each other's."""
    from numba.core import event

    class CompileReporter(event.Listener):
        count, t_start = 0, 0.0

        def on_start(self, ev) -> None:
            if not self.count:
                self.t_start = time.perf_counter()
                if on_first is not None:
                    on_first()
            self.count += 1
            fn = ev.data["dispatcher"].py_func
            progress(f"{COMPILING}: {fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}")

        def on_end(self, ev) -> None:
            pass

    with event.install_listener("numba:compile", CompileReporter()) as listener:
        yield
    if listener.count:
        n = listener.count
        progress(f"{COMPILED} {n} kernel{'s' if n != 1 else ''} in "
                 f"{time.perf_counter() - listener.t_start:.1f} s (cached for next runs)")


def distinct_stages(write: Callable[[str], None]) -> Callable[[str], None]:
    """For logs and pipes: pass a message on only when its stage (the text before ': ')
    changed, so the compile messages make one line, not one per kernel."""
    last = [None]

    def report(message: str) -> None:
        stage = message.split(": ", 1)[0]
        if stage != last[0]:
            last[0] = stage
            write(message)

    return report


class _GcPause:
    """Pauses the collector while a model loads: a warm load creates about a million
    long-lived objects (mostly Numba's typing registries), and full passes over them cost
    0.15-0.3 s of a 1 s start. A first run resumes it at the first compile: compiling makes
    garbage in bulk, and unpaused its peak memory is ~160 MB lower."""

    def __enter__(self) -> _GcPause:
        self.was_enabled = gc.isenabled()
        gc.disable()
        return self

    def resume(self) -> None:
        if self.was_enabled:
            gc.enable()

    def __exit__(self, *exc) -> None:
        self.resume()


def settle_heap() -> None:
    """For a process that keeps its model until it exits (the CLI, the server): take what
    exists now out of the collector's reach, so its full passes stop re-walking Numba's
    object graph while generating, and interpreter exit stops spending ~0.2 s on it. The
    young garbage of the load is collected first, so it is not frozen with the rest."""
    gc.collect(0)
    gc.freeze()


def set_threads(threads: int | None) -> int:
    """Numba's worker count: llama.cpp's default is the number of physical cores."""
    import numba
    import psutil

    available = numba.config.NUMBA_NUM_THREADS
    if threads is None:
        threads = psutil.cpu_count(logical=False) or available
    if threads < 1:
        raise EdgeInferError(f"threads must be >= 1, got {threads}")
    numba.set_num_threads(min(threads, available))
    return min(threads, available)
