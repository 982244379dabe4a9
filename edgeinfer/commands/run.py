"""`edgeinfer run`: load, build the prompt, stream the answer to stdout, timings to stderr."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from edgeinfer.cuda.placement import parse_gpu_layers
from edgeinfer.errors import EdgeInferError
from edgeinfer.sampling_params import SamplingParams
from edgeinfer.settings import DEFAULTS as _D
from edgeinfer.spec.params import SpecParams


@dataclass(frozen=True)
class RunOptions:
    model: str | None
    prompt: str | None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = _D["n_predict"]  # the defaults are the flags' (settings.py)
    threads: int | None = _D["threads"]
    n_ctx: int = _D["ctx_size"]
    raw: bool = _D["raw"]
    system: str | None = _D["system"]
    stop: tuple[str, ...] = _D["stop"]
    quiet: bool = _D["quiet"]
    flash_attn: bool = _D["flash_attn"] == "on"
    grammar: str | None = _D["grammar"]  # GBNF, or Lark after %llguidance
    json_schema: str | None = _D["json_schema"]  # a JSON schema's text
    gpu_layers: int | str = parse_gpu_layers(_D["gpu_layers"])  # -ngl: a count, "all" or "auto"
    host: str | None = _D["remote_host"]  # a running server to use (commands/remote.py)
    local: bool = _D["local"]  # never use a running server
    spec: SpecParams = field(default_factory=SpecParams)  # speculative decoding


def run_command(opts: RunOptions) -> None:
    if opts.prompt is None:
        raise EdgeInferError("no prompt: use -p TEXT, -f FILE, or pipe text on stdin")
    if not opts.prompt.strip():
        raise EdgeInferError("empty prompt: nothing to generate from")
    if not opts.local and not opts.spec.enabled:  # a server runs its own --spec-type
        from edgeinfer.commands.remote import find_server, run_remote

        base = find_server(opts.host, opts.model)
        if base is not None:
            run_remote(base, opts)
            return
    from edgeinfer.generate import stream_generate
    from edgeinfer.sampling import make_sampler

    sampler = make_sampler(opts.sampling)
    model = load_model(opts)
    ids = model.tokenize(build_prompt(model, opts))
    constraint = model.compile_constraint(opts.grammar, opts.json_schema)
    event = None
    for event in stream_generate(model, ids, sampler, opts.n_predict, opts.stop,
                                 constraint=constraint, spec=opts.spec):
        if event.text:
            sys.stdout.write(event.text)
            sys.stdout.flush()
    if sys.stdout.isatty():
        sys.stdout.write("\n")
    if not opts.quiet and event is not None:
        print_timings(event.timings)


def load_model(opts: RunOptions):
    """The model, fetched if it is a known name, loaded with progress on stderr."""
    from edgeinfer.commands.progress import byte_progress, note_printer, status
    from edgeinfer.pull import resolve_model

    with byte_progress(opts.quiet) as report:
        path = resolve_model(opts.model, report)
    with status(f"loading {path.name}", opts.quiet) as update:
        from edgeinfer.api import Model
        from edgeinfer.process import settle_heap

        model = Model.load(path, n_ctx=opts.n_ctx, threads=opts.threads, progress=update,
                           flash_attn=opts.flash_attn, compile_helper=True,
                           gpu_layers=opts.gpu_layers, notes=note_printer(opts.quiet),
                           warm_up=None)  # the first prompt's prefill loads the kernels
        settle_heap()
    return model


def build_prompt(model, opts: RunOptions) -> str:
    """The prompt as the server's /apply-template renders it (the model's template, ChatML
    when it has none), or as given under --raw."""
    if opts.raw:
        return opts.prompt
    return model.apply_chat_template(prompt_messages(opts))


def prompt_messages(opts: RunOptions) -> list[dict]:
    """The chat messages of -sys and the prompt."""
    messages = [{"role": "system", "content": opts.system}] if opts.system else []
    return [*messages, {"role": "user", "content": opts.prompt}]


def print_timings(t) -> None:
    """llama.cpp's end-of-run lines (llama_perf_context_print), on stderr."""
    def line(label: str, ms: float, n: int) -> str:
        per_tok = ms / n if n else 0.0
        per_sec = 1e3 * n / ms if ms else 0.0
        return (f"{label} = {ms:10.2f} ms / {n:5d} tokens ({per_tok:8.2f} ms per token, "
                f"{per_sec:8.2f} tokens per second)\n")

    sys.stderr.write("\n" + line("prompt eval time", t.prompt_ms, t.prompt_n))
    sys.stderr.write(line("       eval time", t.predicted_ms, t.predicted_n))
    drafted = getattr(t, "draft_n", 0)  # a server's timings may not have them
    if drafted:  # llama.cpp's speculative summary
        accepted = t.draft_n_accepted
        sys.stderr.write(f"draft acceptance rate = {accepted / drafted:.5f} "
                         f"({accepted:5d} accepted / {drafted:5d} generated)\n")
