"""Every command-line setting once, as data: its name, spellings, type, default and help,
and which front ends take it. The typer CLI (`cli.py`: `opt`), `edgeinfer serve`'s parser
(`server/options.py`) and edgeinfer-server's llama-server translation (`server/llama_cli.py`:
the `llama` spellings) are all built from `SETTINGS`.

Sampling defaults are `SamplingParams()`'s and speculative ones `SpecParams()`'s, read here
rather than repeated. Nothing heavy is imported, so `--help` stays instant.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgeinfer.sampling_params import N_PREDICT, SamplingParams
from edgeinfer.spec.params import SPEC_TYPES, SpecParams

_SAMPLING, _SPEC = SamplingParams(), SpecParams()
ON_OFF_AUTO = ("on", "off", "auto")
REASONING_FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")
SEED_RANDOM = -1  # how --seed spells SamplingParams.seed None

# The front ends: the CLI's commands, and `edgeinfer serve` (which edgeinfer-server runs).
RUN, CHAT, INFO, BENCH, SERVE = "run", "chat", "info", "bench", "serve"
FRONTS = (RUN, CHAT, INFO, BENCH, SERVE)


@dataclass(frozen=True)
class Setting:
    """One setting. `type` bool is a switch (`off` names the spellings that clear it), list
    a repeatable string; `flags` () is the positional MODEL. `llama` lists llama-server's
    spellings that edgeinfer-server forwards here (common/arg.cpp's); `serve_help` is the
    help where the server means more than the CLI (-c: all slots' KV cells)."""

    name: str
    flags: tuple[str, ...]
    type: type
    default: object
    help: str
    fronts: frozenset[str]
    group: str = ""  # serve's --help section
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    off: tuple[str, ...] = ()
    llama: tuple[str, ...] = ()
    serve_help: str = ""

    @property
    def switch(self) -> bool:
        return self.type is bool

    @property
    def long(self) -> str:
        """The canonical spelling: the first long one."""
        return next(f for f in self.flags if f.startswith("--"))

    def help_for(self, front: str) -> str:
        return self.serve_help if front == SERVE and self.serve_help else self.help


def _s(name: str, flags: str, type: type, default: object, help: str = "", fronts: str = SERVE,
       **extra) -> Setting:
    """A row: `flags` and `fronts` space-separated; `llama="="`: llama-server's spellings
    are edgeinfer's."""
    spelled = tuple(flags.split())
    if extra.get("llama") == "=":
        extra["llama"] = spelled + tuple(extra.get("off", ()))
    elif isinstance(extra.get("llama"), str):
        extra["llama"] = tuple(extra["llama"].split())
    return Setting(name, spelled, type, default, help, frozenset(fronts.split()), **extra)


_MODEL_USERS = "run chat info bench serve"
_LOADERS = "run chat bench serve"
_GENERATORS = "run chat serve"
_SPEC_USERS = "run serve"


def _shared() -> tuple[Setting, ...]:
    """What the CLI and the server both take."""
    return (
        _s("model", "", str, None, "GGUF file or known model name (default: smollm2).",
           _MODEL_USERS),
        _s("threads", "-t --threads", int, None, "Threads (default: physical cores).",
           _LOADERS, group="engine", metavar="N", llama="="),
        _s("ctx_size", "-c --ctx-size", int, 0, "Context size in tokens (0: min(4096, "
           "model's)).", _MODEL_USERS, group="engine", metavar="N", llama="=",
           serve_help="KV cells shared by all slots, one pool (0: -np x the per-request "
                      "limit)"),
        _s("flash_attn", "-fa --flash-attn", str, "off", "Flash attention (online softmax) "
           "with llama.cpp's -fa on numerics; auto: off, the faster path here for decode, and "
           "llama.cpp's -fa off numerics.", _LOADERS, group="engine", metavar="on|off|auto",
           choices=ON_OFF_AUTO, llama="="),
        _s("gpu_layers", "-ngl --gpu-layers --n-gpu-layers", str, "0", "Layers to offload to "
           "a CUDA GPU (the `cuda` extra): the last N, N = n_layer + 1 with the output layer, "
           "all, or auto (as many as fit).", _LOADERS, group="engine", metavar="N|all|auto",
           llama="="),
        *_sampling(),
        *_speculative(),
    )


def _sampling() -> tuple[Setting, ...]:
    """The request defaults (the server's) or the sampler (the CLI's)."""
    g = dict(fronts=_GENERATORS, group="defaults", metavar="N", llama="=")
    return (
        _s("seed", "-s --seed", int, SEED_RANDOM, "RNG seed (-1: random).",
           **{**g, "metavar": "SEED"}),
        _s("temp", "--temp", float, _SAMPLING.temperature, "Temperature (0: greedy).",
           **{**g, "llama": "--temp --temperature"}),
        _s("top_k", "--top-k", int, _SAMPLING.top_k, "Top-k sampling (<= 0: off).", **g),
        _s("top_p", "--top-p", float, _SAMPLING.top_p, "Top-p sampling (1: off).", **g),
        _s("min_p", "--min-p", float, _SAMPLING.min_p, "Min-p sampling (0: off).", **g),
        _s("repeat_penalty", "--repeat-penalty", float, _SAMPLING.repeat_penalty,
           "Penalty of repeated tokens (1: off).", **g),
        _s("repeat_last_n", "--repeat-last-n", int, _SAMPLING.repeat_last_n,
           "Tokens the penalties look back at (0: off, -1: the context).", **g),
        _s("presence_penalty", "--presence-penalty", float, _SAMPLING.presence_penalty,
           "Presence penalty (0: off).", **g),
        _s("frequency_penalty", "--frequency-penalty", float, _SAMPLING.frequency_penalty,
           "Frequency penalty (0: off).", **g),
        _s("n_predict", "-n --n-predict", int, N_PREDICT, "Tokens to generate (-1: until "
           "EOS).", **{**g, "llama": "-n --predict --n-predict"}),
    )


def _speculative() -> tuple[Setting, ...]:
    g = dict(fronts=_SPEC_USERS, group="spec", metavar="N", llama="=")
    return (
        _s("spec_type", "--spec-type", str, _SPEC.type, "Speculative decoding: none, "
           "ngram-simple (drafts copied from the context) or draft-simple (drafts from -md); "
           "the same output.", **{**g, "metavar": "TYPE"}, choices=SPEC_TYPES),
        _s("model_draft", "-md --spec-draft-model --model-draft", Path, _SPEC.draft_model,
           "A smaller model of the same vocabulary drafts (draft-simple).",
           **{**g, "metavar": "FNAME", "llama": "--spec-draft-model -md --model-draft"}),
        _s("spec_draft_n_max", "--spec-draft-n-max", int, _SPEC.n_max,
           "Most tokens drafted a step.", **g),
        _s("spec_draft_n_min", "--spec-draft-n-min", int, _SPEC.n_min,
           "Shorter drafts are not checked.", **g),
        _s("spec_draft_p_min", "--spec-draft-p-min --draft-p-min", float, _SPEC.p_min,
           "draft-simple: stop drafting below this probability.", **{**g, "metavar": "P"}),
        _s("spec_ngram_simple_size_n", "--spec-ngram-simple-size-n", int, _SPEC.ngram_size_n,
           "ngram-simple: tokens matched in the context (llama-server's default is 12).", **g),
        _s("spec_ngram_simple_size_m", "--spec-ngram-simple-size-m", int, _SPEC.ngram_size_m,
           "ngram-simple: tokens drafted after a match.", **g),
    )


def _cli() -> tuple[Setting, ...]:
    """The CLI's own."""
    return (
        _s("prompt", "-p --prompt", str, None, "Prompt text.", RUN),
        _s("file", "-f --file", Path, None, "Read the prompt from a file.", RUN),
        _s("remote_host", "--host", str, None, "Use the edgeinfer server at URL (default: "
           "$EDGEINFER_HOST, else 127.0.0.1:8080 when one answers there and serves MODEL).",
           "run chat", metavar="URL"),
        _s("local", "--local", bool, False, "Load the model here even when a server is "
           "running.", "run chat"),
        _s("raw", "--raw", bool, False, "Feed the prompt as is, without chat template.", RUN),
        _s("system", "--system", str, None, "System message (chat mode).", "run chat"),
        _s("stop", "--stop", list, (), "Stop at this string (repeatable).", RUN),
        _s("quiet", "-q --quiet", bool, False, "No progress or timings on stderr.", "run chat"),
        _s("grammar", "--grammar", str, None, "Constrain the output: GBNF (or Lark after "
           "%llguidance).", RUN),
        _s("grammar_file", "--grammar-file", Path, None, "Read the grammar from a file.", RUN),
        _s("json_schema", "-j --json-schema", str, None, "Constrain the output to this JSON "
           "schema.", RUN),
        _s("json_schema_file", "--json-schema-file", Path, None, "Read the JSON schema from "
           "a file.", RUN),
        _s("n_prompt", "-p --n-prompt", int, 512, "Prompt tokens (pp test).", BENCH),
        _s("n_gen", "-n --n-gen", int, 128, "Generated tokens (tg test).", BENCH),
        _s("reps", "-r --repetitions", int, 5, "Repetitions of each test.", BENCH),
        _s("n_depth", "-d --n-depth", int, 0, "Tokens already in the context before each "
           "test.", BENCH),
        _s("as_json", "--json", bool, False, "llama-bench's JSON rows on stdout.", BENCH),
    )


def _network() -> tuple[Setting, ...]:
    g = dict(group="network")
    return (
        _s("host", "--host", str, "127.0.0.1", "address(es) to listen on, comma-separated",
           metavar="HOST", llama="=", **g),
        _s("port", "--port", int, 8080, "0: a free port, named in the 'listening on' line",
           metavar="PORT", llama="=", **g),
        _s("api_key", "--api-key", str, None, "require this bearer key (comma: several)",
           metavar="KEY", llama="=", **g),
        _s("cors_origins", "--cors-origins", str, "localhost", "origins browsers may call "
           "from, comma-separated: exact origins, * or localhost (any port of localhost, "
           "127.0.0.1, ::1)", metavar="ORIGINS", llama="=", **g),
        _s("allowed_hosts", "--allowed-hosts", str, "", "Host names accepted besides IP "
           "addresses, localhost and this machine's name, comma-separated (*: any; the DNS "
           "rebinding guard off)", metavar="HOSTS", **g),
        _s("max_body_bytes", "--max-body-bytes", int, 64 << 20, "larger request bodies get "
           "413", metavar="N", **g),
        _s("sse_ping_interval", "--sse-ping-interval", float, 30.0, "seconds between SSE "
           "keep-alive comments (<= 0: none)", metavar="SECONDS", **g),
        _s("shutdown_timeout", "--shutdown-timeout", float, 30.0, "seconds running requests "
           "get after SIGTERM before they are ended", metavar="SECONDS", **g),
    )


def _engine() -> tuple[Setting, ...]:
    g = dict(group="engine", metavar="N")
    return (
        _s("kv_unified_per_slot", "--kv-unified-per-slot", int, 0, "the most context one "
           "request may use (0: -c, or min(4096, the model's) without -c)", llama="=", **g),
        _s("parallel", "-np --parallel", int, -1, "slots; -1: auto (4)", llama="=", **g),
        _s("batch_size", "-b --batch-size", int, 512, "prompt tokens per forward pass",
           llama="=", **g),
        _s("cache_ram", "-cram --cache-ram", int, 1024, "MiB of RAM for prompts no slot holds "
           "any more (0: off)", llama="=", **g),
        _s("kv_unified", "-kvu --kv-unified", bool, False, "the KV pool is always shared; "
           "with this flag idle slots are also moved to the RAM cache when another slot "
           "starts (see --no-cache-idle-slots)", llama="=", group="engine"),
        _s("no_cache_idle_slots", "--no-cache-idle-slots", bool, False, "with --kv-unified, "
           "keep idle slots' KV where it is", llama="=", group="engine"),
        _s("sleep_idle_seconds", "--sleep-idle-seconds", float, -1.0, "unload the model "
           "after this many idle seconds; the next request that needs it loads it again "
           "(-1: never)", llama="=", **{**g, "metavar": "SECONDS"}),
    )


def _api() -> tuple[Setting, ...]:
    g = dict(group="api", llama="=")
    return (
        _s("alias", "-a --alias", str, None, "the model's name(s) in the API, "
           "comma-separated", metavar="STRING", **g),
        _s("tags", "--tags", str, None, "tags listed with the model, comma-separated",
           metavar="STRING", **g),
        _s("metrics", "--metrics", bool, False, "enable /metrics", **g),
        _s("no_slots", "--no-slots", bool, False, "disable /slots (501)", **g),
        _s("no_ui", "--no-ui --no-webui", bool, False, "no chat page at / (it is served by "
           "default)", **g),
        _s("verbose", "-v --verbose", bool, False, "log each request and reply; `verbose` "
           "requests get __verbose", group="api", llama="-v --verbose --log-verbose"),
    )


def _chat() -> tuple[Setting, ...]:
    g = dict(group="chat", llama="=")
    return (
        _s("chat_template", "--chat-template", str, None, "a built-in template's name "
           "(chatml, llama3, ...) or Jinja source, instead of the GGUF's",
           metavar="JINJA_TEMPLATE", **g),
        _s("chat_template_file", "--chat-template-file", Path, None, "read the Jinja chat "
           "template from this file", metavar="JINJA_TEMPLATE_FILE", **g),
        _s("jinja", "--jinja", bool, True, "render templates with Jinja (the default; "
           "--no-jinja: llama.cpp's built-in formatters)", off=("--no-jinja",), **g),
        _s("reasoning", "-rea --reasoning", str, "auto", "thinking in templates that have it "
           "(auto: the template's default)", metavar="on|off|auto", choices=ON_OFF_AUTO, **g),
        _s("reasoning_format", "--reasoning-format", str, "deepseek", "where thinking goes: "
           "reasoning_content (deepseek, auto) or the content (none)", metavar="FORMAT",
           choices=REASONING_FORMATS, **g),
    )


def _router() -> tuple[Setting, ...]:
    g = dict(group="router", llama="=")
    return (
        _s("models_dir", "--models-dir", Path, None, "serve every GGUF file in DIR (and the "
           "pulled models), each loaded in its own process when a request names it",
           metavar="DIR", **g),
        _s("models_max", "--models-max", int, 4, "models loaded at once; past it the least "
           "recently used idle one is unloaded", metavar="N", **g),
        _s("keep_alive", "--keep-alive", float, -1.0, "unload a model idle this long (-1: "
           "never); a request's keep_alive overrides it for its model",
           metavar="SECONDS", group="router"),
    )


SETTINGS: tuple[Setting, ...] = (*_shared(), *_cli(), *_network(), *_engine(), *_api(),
                                 *_chat(), *_router())
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
DEFAULTS: dict[str, object] = {s.name: s.default for s in SETTINGS}


def setting(name: str) -> Setting:
    return BY_NAME[name]


def for_front(front: str) -> tuple[Setting, ...]:
    """The settings a front end takes, in table order."""
    return tuple(s for s in SETTINGS if front in s.fronts)
