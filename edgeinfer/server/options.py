"""The server's settings: `ServerSettings` and the one parser that fills it for `edgeinfer
serve` and `python -m edgeinfer.server`, built from the settings table (settings.py), whose
defaults `ServerSettings` also takes (edgeinfer-server translates llama-server's command line
into these flags; llama_cli.py). Only argparse is imported here, so `--help` stays instant.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

from edgeinfer.cuda.placement import parse_gpu_layers
from edgeinfer.errors import EdgeInferError
from edgeinfer.sampling_params import SamplingParams
from edgeinfer.settings import BY_NAME, DEFAULTS, SEED_RANDOM, SERVE, Setting, for_front, setting
from edgeinfer.spec.params import SpecParams, spec_params

AUTO_SLOTS = 4  # -np -1
_D = DEFAULTS


@dataclass(frozen=True)
class ChatOptions:
    """How chat messages become a prompt and how the reply is read back (llama-server's
    --jinja, --chat-template(-file), --reasoning, --reasoning-format)."""

    template: str = ""  # a built-in template's name or Jinja source; "": the GGUF's
    jinja: bool = _D["jinja"]
    reasoning: str = _D["reasoning"]  # on | off | auto: thinking enabled in the template
    reasoning_format: str = _D["reasoning_format"]  # none | deepseek | ... | auto


@dataclass(frozen=True)
class ServerSettings:
    """Everything `serve()` needs besides the model file."""

    hosts: tuple[str, ...] = (_D["host"],)  # each is listened on, on the same port
    port: int = _D["port"]
    n_ctx: int = _D["ctx_size"]  # KV cells shared by all slots; 0: n_slots x a request's
    n_ctx_slot: int = _D["kv_unified_per_slot"]  # a request's limit; 0: n_ctx, or 4096
    n_slots: int = AUTO_SLOTS
    n_batch: int = _D["batch_size"]  # prompt tokens per forward pass
    threads: int | None = _D["threads"]
    flash_attn: bool = _D["flash_attn"] == "on"
    gpu_layers: int | str = parse_gpu_layers(_D["gpu_layers"])  # a count, "all" or "auto"
    api_keys: tuple[str, ...] = ()
    metrics: bool = _D["metrics"]
    slots_endpoint: bool = not _D["no_slots"]  # --no-slots: /slots answers 501
    ui: bool = not _D["no_ui"]  # the chat page at / (--no-ui: / is a 404)
    aliases: tuple[str, ...] = ()  # names of the model in the API; none: the file name
    tags: tuple[str, ...] = ()
    cache_ram_mib: int = _D["cache_ram"]
    cache_idle_slots: bool = not _D["no_cache_idle_slots"]  # a unified KV's idle slots: RAM
    kv_unified: bool = _D["kv_unified"]
    max_body_bytes: int = _D["max_body_bytes"]
    sse_ping_interval: float = _D["sse_ping_interval"]
    cors_origins: str = _D["cors_origins"]
    allowed_hosts: str = _D["allowed_hosts"]
    shutdown_timeout: float = _D["shutdown_timeout"]
    sleep_idle_seconds: float = _D["sleep_idle_seconds"]  # > 0: unload after this long idle
    verbose: bool = _D["verbose"]
    sampling: SamplingParams = field(default_factory=SamplingParams)  # request defaults
    n_predict: int = _D["n_predict"]  # the default of a request's n_predict
    chat: ChatOptions = field(default_factory=ChatOptions)
    spec: SpecParams = field(default_factory=SpecParams)  # speculative decoding (--spec-*)

    def __post_init__(self):
        if self.max_body_bytes < 1 or not math.isfinite(self.sse_ping_interval):
            raise EdgeInferError("--max-body-bytes must be >= 1 and --sse-ping-interval "
                                 "finite")
        if not self.hosts:
            raise EdgeInferError("--host: give at least one address")


GROUPS = {"network": "network", "engine": "engine",
          "spec": "speculative decoding (the same output, sooner)", "api": "API",
          "defaults": "defaults of requests that do not set them", "chat": "chat",
          "router": "router mode (no MODEL)"}  # serve's --help sections, in order
ROUTER_OWN = ("models_dir", "models_max", "keep_alive", "host", "port")  # not the workers'
ROUTER_FLAGS = {flag: not BY_NAME[name].switch for name in ROUTER_OWN
                for flag in BY_NAME[name].flags}  # True: takes a value


def _add(g: argparse._ArgumentGroup, s: Setting) -> None:
    """One setting as an argparse argument: a switch (and its --no- spellings), a choice or
    a typed value."""
    help = s.help_for(SERVE)
    if s.switch:
        g.add_argument(*s.flags, dest=s.name, action="store_true", default=s.default,
                       help=help)
        if s.off:
            g.add_argument(*s.off, dest=s.name, action="store_false",
                           help=f"the opposite of {s.long}")
        return
    if s.default not in (None, ""):
        help = f"{help} (default: {s.default})"
    g.add_argument(*s.flags, dest=s.name, type=s.type, default=s.default, help=help,
                   choices=s.choices or None, metavar=None if s.choices else s.metavar)


class _Parser(argparse.ArgumentParser):
    """A wrong flag is one line on stderr and exit code 2, not the whole usage."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} -h)\n")


def build_parser(prog: str) -> argparse.ArgumentParser:
    """`edgeinfer serve`'s parser: the table's serve settings (settings.py), by section."""
    p = _Parser(prog=prog, description="llama-server and OpenAI compatible HTTP API",
                usage=f"{prog} [MODEL] [flags]")
    model = setting("model")
    p.add_argument("model", nargs="?", default=model.default, help=model.help_for(SERVE))
    taken = [s for s in for_front(SERVE) if s.flags]
    for group, title in GROUPS.items():
        g = p.add_argument_group(title)
        for s in (s for s in taken if s.group == group):
            _add(g, s)
    return p


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
        seed=None if args.seed <= SEED_RANDOM else args.seed)
    if args.batch_size < 1:
        raise EdgeInferError(f"--batch-size must be >= 1, got {args.batch_size}")
    return ServerSettings(
        hosts=_split(args.host), port=args.port, n_ctx=args.ctx_size,
        n_ctx_slot=args.kv_unified_per_slot,
        n_slots=args.parallel if args.parallel > 0 else AUTO_SLOTS, n_batch=args.batch_size,
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
