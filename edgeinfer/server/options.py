"""The server's settings, defined once: `ServerSettings` and the one parser that fills it for
`edgeinfer serve` and `python -m edgeinfer.server` (edgeinfer-server translates llama-server's
command line into these flags; llama_cli.py). Flag names follow llama-server's where it has
the option. Only argparse is imported here, so `--help` stays instant.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

from edgeinfer.cuda.placement import parse_gpu_layers
from edgeinfer.errors import EdgeInferError
from edgeinfer.sampling import N_PREDICT, SamplingParams
from edgeinfer.spec.params import SPEC_TYPES, SpecParams, spec_params

SAMPLING = SamplingParams()
REASONING = ("on", "off", "auto")
REASONING_FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")


@dataclass(frozen=True)
class ChatOptions:
    """How chat messages become a prompt and how the reply is read back (llama-server's
    --jinja, --chat-template(-file), --reasoning, --reasoning-format)."""

    template: str = ""  # a built-in template's name or Jinja source; "": the GGUF's
    jinja: bool = True
    reasoning: str = "auto"  # on | off | auto: thinking enabled in the template
    reasoning_format: str = "deepseek"  # none | deepseek | deepseek-legacy | auto


@dataclass(frozen=True)
class ServerSettings:
    """Everything `serve()` needs besides the model file."""

    hosts: tuple[str, ...] = ("127.0.0.1",)  # each is listened on, on the same port
    port: int = 8080
    n_ctx: int = 0  # KV cells shared by all slots; 0: n_slots x the per-request limit
    n_ctx_slot: int = 0  # a request's limit (--kv-unified-per-slot); 0: n_ctx, or 4096
    n_slots: int = 4
    n_batch: int = 512  # prompt tokens per forward pass
    threads: int | None = None
    flash_attn: bool = False
    gpu_layers: int | str = 0  # -ngl: a count, "all" or "auto" (cuda/placement.py)
    api_keys: tuple[str, ...] = ()
    metrics: bool = False
    slots_endpoint: bool = True  # --no-slots: /slots answers 501
    ui: bool = True  # the chat page at / (--no-ui: / is a 404)
    aliases: tuple[str, ...] = ()  # names of the model in the API; none: the file name
    tags: tuple[str, ...] = ()
    cache_ram_mib: int = 1024
    cache_idle_slots: bool = True  # with a unified KV: idle slots move to the RAM cache
    kv_unified: bool = False
    max_body_bytes: int = 64 << 20
    sse_ping_interval: float = 30.0
    cors_origins: str = "localhost"
    allowed_hosts: str = ""
    shutdown_timeout: float = 30.0
    sleep_idle_seconds: float = -1.0  # > 0: unload the model after this long idle
    verbose: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)  # request defaults
    n_predict: int = N_PREDICT  # the default of a request's n_predict
    chat: ChatOptions = field(default_factory=ChatOptions)
    spec: SpecParams = field(default_factory=SpecParams)  # speculative decoding (--spec-*)

    def __post_init__(self):
        if self.max_body_bytes < 1 or not math.isfinite(self.sse_ping_interval):
            raise EdgeInferError("--max-body-bytes must be >= 1 and --sse-ping-interval "
                                 "finite")
        if not self.hosts:
            raise EdgeInferError("--host: give at least one address")


def _add_network(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("network")
    g.add_argument("--host", default="127.0.0.1",
                   help="address(es) to listen on, comma-separated (default: 127.0.0.1)")
    g.add_argument("--port", type=int, default=8080,
                   help="0: a free port, named in the 'listening on' line")
    g.add_argument("--api-key", default=None, help="require this bearer key (comma: several)")
    g.add_argument("--cors-origins", default="localhost",
                   help="origins browsers may call from, comma-separated: exact origins, * or "
                        "localhost (any port of localhost, 127.0.0.1, ::1; the default)")
    g.add_argument("--allowed-hosts", default="",
                   help="Host names accepted besides IP addresses, localhost and this "
                        "machine's name, comma-separated (*: any; the DNS rebinding guard off)")
    g.add_argument("--max-body-bytes", type=int, default=64 << 20,
                   help="larger request bodies get 413 (default: 64 MiB)")
    g.add_argument("--sse-ping-interval", type=float, default=30.0,
                   help="seconds between SSE keep-alive comments (<= 0: none)")
    g.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds running requests get after SIGTERM before they are ended")


def _add_engine(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("-c", "--ctx-size", type=int, default=0, dest="n_ctx",
                   help="KV cells shared by all slots, one pool (0: -np x the per-request "
                        "limit)")
    g.add_argument("--kv-unified-per-slot", type=int, default=0, dest="n_ctx_slot",
                   metavar="N", help="the most context one request may use (0: -c, or "
                   "min(4096, the model's) without -c)")
    g.add_argument("-np", "--parallel", type=int, default=-1, help="slots; -1: auto (4)")
    g.add_argument("-b", "--batch-size", type=int, default=512, dest="n_batch",
                   help="prompt tokens per forward pass (default 512)")
    g.add_argument("-t", "--threads", type=int, default=None)
    g.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default="off",
                   help="flash attention, llama.cpp's -fa on numerics (auto: off)")
    g.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", default="0", metavar="N",
                   dest="gpu_layers", help="layers to offload to a CUDA GPU: the last N "
                   "(n_layer + 1: the output layer too), all, or auto (as many as fit)")
    g.add_argument("-cram", "--cache-ram", type=int, default=1024, dest="cache_ram",
                   help="MiB of RAM for prompts no slot holds any more (0: off)")
    g.add_argument("-kvu", "--kv-unified", action="store_true",
                   help="the KV pool is always shared; with this flag idle slots are also "
                        "moved to the RAM cache when another slot starts "
                        "(see --no-cache-idle-slots)")
    g.add_argument("--no-cache-idle-slots", action="store_true",
                   help="with --kv-unified, keep idle slots' KV where it is")
    g.add_argument("--sleep-idle-seconds", type=float, default=-1,
                   help="unload the model after this many idle seconds; the next request "
                        "that needs it loads it again (-1: never)")


def _add_spec(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (the same output, sooner)")
    g.add_argument("--spec-type", choices=SPEC_TYPES, default="none",
                   help="ngram-simple: drafts copied from the context; draft-simple: drafts "
                        "from -md (default: none, or draft-simple with -md)")
    g.add_argument("-md", "--spec-draft-model", "--model-draft", type=Path, default=None,
                   dest="model_draft", metavar="FNAME",
                   help="a smaller model of the same vocabulary that drafts")
    g.add_argument("--spec-draft-n-max", type=int, default=16, metavar="N",
                   help="most tokens drafted a step (default 16)")
    g.add_argument("--spec-draft-n-min", type=int, default=0, metavar="N",
                   help="shorter drafts are not checked (default 0)")
    g.add_argument("--spec-draft-p-min", "--draft-p-min", type=float, default=0.0,
                   metavar="P", help="draft-simple: stop drafting below this probability")
    g.add_argument("--spec-ngram-simple-size-n", type=int, default=3, metavar="N",
                   help="ngram-simple: tokens matched in the context (default 3; "
                        "llama-server's is 12)")
    g.add_argument("--spec-ngram-simple-size-m", type=int, default=48, metavar="N",
                   help="ngram-simple: tokens drafted after a match (default 48)")


def _add_api(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("API")
    g.add_argument("-a", "--alias", default=None,
                   help="the model's name(s) in the API, comma-separated")
    g.add_argument("--tags", default=None, help="tags listed with the model, comma-separated")
    g.add_argument("--metrics", action="store_true", help="enable /metrics")
    g.add_argument("--no-slots", action="store_true", help="disable /slots (501)")
    g.add_argument("--no-ui", "--no-webui", action="store_true", dest="no_ui",
                   help="no chat page at / (it is served by default)")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="log each request and reply; `verbose` requests get __verbose")


def _add_defaults(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("defaults of requests that do not set them")
    g.add_argument("-s", "--seed", type=int, default=-1, help="RNG seed (-1: random)")
    g.add_argument("--temp", type=float, default=SAMPLING.temperature)
    g.add_argument("--top-k", type=int, default=SAMPLING.top_k)
    g.add_argument("--top-p", type=float, default=SAMPLING.top_p)
    g.add_argument("--min-p", type=float, default=SAMPLING.min_p)
    g.add_argument("--repeat-penalty", type=float, default=SAMPLING.repeat_penalty)
    g.add_argument("--repeat-last-n", type=int, default=SAMPLING.repeat_last_n)
    g.add_argument("--presence-penalty", type=float, default=SAMPLING.presence_penalty)
    g.add_argument("--frequency-penalty", type=float, default=SAMPLING.frequency_penalty)
    g.add_argument("-n", "--n-predict", type=int, default=N_PREDICT,
                   help=f"tokens to generate (-1: until EOS; default {N_PREDICT})")


def _add_chat(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("chat")
    g.add_argument("--chat-template", default=None,
                   help="a built-in template's name (chatml, llama3, ...) or Jinja source, "
                        "instead of the GGUF's")
    g.add_argument("--chat-template-file", type=Path, default=None,
                   help="read the Jinja chat template from this file")
    g.add_argument("--jinja", dest="jinja", action="store_true", default=True,
                   help="render templates with Jinja (the default)")
    g.add_argument("--no-jinja", dest="jinja", action="store_false",
                   help="llama.cpp's built-in formatters instead of Jinja")
    g.add_argument("-rea", "--reasoning", choices=REASONING, default="auto",
                   help="thinking in templates that have it (auto: the template's default)")
    g.add_argument("--reasoning-format", choices=REASONING_FORMATS, default="deepseek",
                   help="where thinking goes: reasoning_content (deepseek, auto) or the "
                        "content (none)")


class _Parser(argparse.ArgumentParser):
    """A wrong flag is one line on stderr and exit code 2, not the whole usage."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} -h)\n")


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description="llama-server and OpenAI compatible HTTP API",
                usage=f"{prog} [MODEL] [flags]")
    p.add_argument("model", nargs="?", default=None,
                   help="GGUF file or known model name (default: smollm2)")
    for add in (_add_network, _add_engine, _add_spec, _add_api, _add_defaults, _add_chat,
                _add_router):
        add(p)
    return p


ROUTER_FLAGS = {"--models-dir": True, "--models-max": True, "--keep-alive": True,
                "--host": True, "--port": True}  # the router's own; True: takes a value


def _add_router(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("router mode (no MODEL)")
    g.add_argument("--models-dir", type=Path, default=None, metavar="DIR",
                   help="serve every GGUF file in DIR (and the pulled models), each loaded "
                        "in its own process when a request names it")
    g.add_argument("--models-max", type=int, default=4, metavar="N",
                   help="models loaded at once; past it the least recently used idle one "
                        "is unloaded (default 4)")
    g.add_argument("--keep-alive", type=float, default=-1.0, metavar="SECONDS",
                   help="unload a model idle this long (default -1: never); a request's "
                        "keep_alive overrides it for its model")


def worker_args(argv: list[str]) -> list[str]:
    """A router's command line without its own flags and without a model: what each
    worker process gets."""
    out, i = [], 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in ROUTER_FLAGS:
            i += 1 if "=" in argv[i] or not ROUTER_FLAGS[name] else 2
            continue
        out.append(argv[i])
        i += 1
    return out


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())


def _template(args: argparse.Namespace) -> str:
    if args.chat_template_file is None:
        return args.chat_template or ""
    try:
        return args.chat_template_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgeInferError(f"cannot read --chat-template-file {args.chat_template_file}: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """The parsed flags as settings; a value out of range is an EdgeInferError."""
    sampling = SamplingParams(
        temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        seed=None if args.seed < 0 else args.seed)
    if args.n_batch < 1:
        raise EdgeInferError(f"--batch-size must be >= 1, got {args.n_batch}")
    return ServerSettings(
        hosts=_split(args.host), port=args.port, n_ctx=args.n_ctx, n_ctx_slot=args.n_ctx_slot,
        n_slots=args.parallel if args.parallel > 0 else 4, n_batch=args.n_batch,
        threads=args.threads, flash_attn=args.flash_attn == "on",
        gpu_layers=parse_gpu_layers(args.gpu_layers), api_keys=_split(args.api_key),
        metrics=args.metrics, slots_endpoint=not args.no_slots, ui=not args.no_ui,
        aliases=_split(args.alias), tags=_split(args.tags), cache_ram_mib=args.cache_ram,
        cache_idle_slots=not args.no_cache_idle_slots, kv_unified=args.kv_unified,
        max_body_bytes=args.max_body_bytes, sse_ping_interval=args.sse_ping_interval,
        cors_origins=args.cors_origins, allowed_hosts=args.allowed_hosts,
        shutdown_timeout=args.shutdown_timeout, sleep_idle_seconds=args.sleep_idle_seconds,
        verbose=args.verbose, sampling=sampling, n_predict=args.n_predict,
        chat=ChatOptions(_template(args), args.jinja, args.reasoning, args.reasoning_format),
        spec=spec_params(args.spec_type, args.model_draft, n_max=args.spec_draft_n_max,
                         n_min=args.spec_draft_n_min, p_min=args.spec_draft_p_min,
                         ngram_size_n=args.spec_ngram_simple_size_n,
                         ngram_size_m=args.spec_ngram_simple_size_m))
