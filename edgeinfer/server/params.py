"""Request JSON -> typed, validated objects, at the edge (llama-server's params_from_json_cmpl
and oaicompat_*_params_parse). Field names are llama-server's (its tools/server/README.md);
the sampling defaults are `SamplingParams()`'s and the length default `N_PREDICT`. Anything
wrong raises `ApiError(400)` with a one-line message; nothing downstream re-checks the types.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from edgeinfer.chat.grammar import LazyStart
from edgeinfer.errors import EdgeInferError
from edgeinfer.sampling import N_PREDICT, LogitBias, SamplingParams
from edgeinfer.server.errors import bad_request
from edgeinfer.structured.compile import Constraint

INT32_MAX = 2**31 - 1
MAX_PROMPTS = 256  # prompts in one request (llama-server: no limit)
SSE_PING_FLOOR = 1.0  # seconds; llama-server reads sse_ping_interval as whole seconds
DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED: "pick a random seed"
PromptPiece = str | int


@dataclass(frozen=True)
class GenParams:
    """Everything one generation needs besides its prompt tokens."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    logit_bias: LogitBias = ()  # ignore_eos's -inf for each end-of-generation token included
    n_predict: int = N_PREDICT  # -1: until EOS or the context is full
    stop: tuple[str, ...] = ()
    stream: bool = False
    n_probs: int = 0  # top-N alternatives reported per generated token
    logprobs: bool = False  # report the sampled token's log-probability (and the top-N)
    cache_prompt: bool = True
    ignore_eos: bool = False
    id_slot: int = -1
    include_usage: bool = False  # stream_options.include_usage (OpenAI routes)
    return_tokens: bool = False
    timings_per_token: bool = False
    sse_ping_interval: float | None = None  # None: the server's --sse-ping-interval
    n_cmpl: int = 1  # completions per prompt ("n"); the server checks it against its slots
    post_sampling_probs: bool = False  # n_probs after the sampling chain, as probabilities
    return_progress: bool = False  # stream prompt_progress events while the prompt is read
    response_fields: tuple[str, ...] = ()  # /completion: only these fields ("a/b": nested)
    verbose: bool = False  # add __verbose (the native reply) to OpenAI replies
    constraint: Constraint | None = None  # grammar / json_schema / response_format / tools
    strict: bool = False  # the schema must be enforced whole (response_format's strict)
    lazy: LazyStart | None = None  # the constraint applies from a trigger word on
    prefill: str = ""  # text fed to the constraint before the first generated token
    preserved: frozenset[int] = frozenset()  # special tokens streamed as their text
    # speculative.n_max / n_min / p_min: the server's --spec-draft-* for this request (-1:
    # the server's)
    spec_n_max: int = -1
    spec_n_min: int = -1
    spec_p_min: float = -1.0


DEFAULTS = GenParams()


@dataclass(frozen=True)
class CompletionRequest:
    """/completion and /v1/completions: one or more prompts, each a list of text/ids."""

    prompts: list[list[PromptPiece]]
    params: GenParams


@dataclass(frozen=True)
class ChatRequest:
    params: GenParams
    logprobs: bool = False


@dataclass(frozen=True)
class Vocab:
    """What parsing needs from the model: token-level fields (logit_bias, ignore_eos)."""

    n_vocab: int
    eog: tuple[int, ...] = ()  # end-of-generation ids: ignore_eos bans them
    tokenize: Callable[[str], list[int]] | None = None  # no BOS, specials as text


# -- typed field readers --------------------------------------------------------------------
def _number(body: dict, key: str, default: float, lo: float = -math.inf,
            hi: float = math.inf, clamp: bool = False) -> float:
    """A finite number in [lo, hi]: outside it, 400, or with `clamp` the nearest bound
    (llama-server's set_limits, which clamps, and set_hard_limits, which refuses)."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise bad_request(f"'{key}' must be a finite number, got {value!r}")
    value = float(value)
    if clamp:
        return min(max(value, lo), hi)
    if not lo <= value <= hi:
        raise bad_request(f"'{key}' must be between {lo:g} and {hi:g}, got {value:g}")
    return value


def _integer(body: dict, key: str, default: int, lo: int = -INT32_MAX - 1,
             hi: int = INT32_MAX) -> int:
    """An integer in [lo, hi] (llama-server reads int32 fields); 400 outside it."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{key}' must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise bad_request(f"'{key}' must be between {lo} and {hi}, got {value}")
    return value


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def _boolean(body: dict, key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{key}' must be a boolean, got {value!r:.40}")
    return value


def _check_model(body: dict) -> None:
    """`model` names the model on the OpenAI routes; this server has one, so any name is
    fine, but it must be a name."""
    if not isinstance(body.get("model", ""), (str, type(None))):
        raise bad_request(f"'model' must be a string, got {body['model']!r:.40}")


def _stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise bad_request("'stop' must be a string or an array of strings")


UNSUPPORTED = ("mirostat", "dry_multiplier", "xtc_probability", "lora")
_TOKEN_ID = re.compile(r"\s*[+-]?\d+")


def _reject_unsupported(body: dict) -> None:
    """Refuse constraints we would otherwise silently ignore (llama.cpp issue #24097)."""
    for key in UNSUPPORTED:
        value = body.get(key)
        if value not in (None, "", [], {}, 0, 0.0):
            raise bad_request(f"'{key}' is not supported by this server")


def _n_cmpl(body: dict) -> int:
    """n_cmpl, else OpenAI's n: completions of each prompt (llama-server's n_cmpl field)."""
    n = _integer(body, "n", 1, 1)  # checked even when n_cmpl wins over it
    return _integer(body, "n_cmpl", n, 1)


def _bias_value(value: Any, where: str) -> float:
    """A number, or false: -inf, the token is never sampled (llama-server's parse_bias)."""
    if value is False:
        return -math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise bad_request(f"'logit_bias' {where}: the bias must be a number or false, "
                          f"got {value!r:.40}")
    return float(value)


def _bias_tokens(key: Any, vocab: Vocab | None, where: str, is_key: bool) -> list[int]:
    """A token id, or a string whose tokens all get the bias (llama-server's logit_bias).
    An object's key that reads as an integer is an id (strtol there)."""
    if is_key and _TOKEN_ID.fullmatch(key):
        key = int(key)
    key = _as_id(key)
    if _is_id(key):
        if key < 0 or (vocab is not None and key >= vocab.n_vocab):
            raise bad_request(f"'logit_bias' {where}: token id {key} is outside the vocabulary")
        return [key]
    if isinstance(key, str) and vocab is not None and vocab.tokenize is not None:
        return vocab.tokenize(key)
    raise bad_request(f"'logit_bias' {where}: expected a token id or a string, got {key!r:.40}")


def _logit_bias(body: dict, vocab: Vocab | None, ignore_eos: bool) -> LogitBias:
    """llama-server's forms: {"id" or "text": bias} (OpenAI's), [[id or "text", bias]];
    with ignore_eos every end-of-generation token is appended with -inf, as llama-server
    does (so generation_settings lists them)."""
    value = _default(body.get("logit_bias"), [])
    is_key = isinstance(value, dict)
    if is_key:
        pairs = list(value.items())
    elif isinstance(value, list) and all(isinstance(e, list) and len(e) == 2 for e in value):
        pairs = [(e[0], e[1]) for e in value]
    else:
        raise bad_request("'logit_bias' must be an object {token: bias} or an array of "
                          "[token, bias] pairs")
    bias = []
    for i, (key, number) in enumerate(pairs):
        where = f"entry {i}"
        b = _bias_value(number, where)
        bias += [(token, b) for token in _bias_tokens(key, vocab, where, is_key)]
    if ignore_eos and vocab is not None:
        bias += [(token, -math.inf) for token in vocab.eog]
    return tuple(bias)


def _sampling(body: dict, defaults: SamplingParams) -> SamplingParams:
    """The request's sampling fields over the server's defaults (its --temp, --seed...)."""
    d = defaults
    seed = _integer(body, "seed", -1 if d.seed is None else d.seed, -1, 2**64 - 1)
    if seed == -1 or seed == DEFAULT_SEED:  # -1 and DEFAULT_SEED: None, random
        seed = None
    try:
        return SamplingParams(
            temperature=_number(body, "temperature", d.temperature, 0.0, clamp=True),
            top_k=max(_integer(body, "top_k", d.top_k), 0),
            top_p=_number(body, "top_p", d.top_p, 0.0, 1.0, clamp=True),
            min_p=_number(body, "min_p", d.min_p, 0.0, 1.0, clamp=True),
            repeat_penalty=_number(body, "repeat_penalty", d.repeat_penalty),
            repeat_last_n=_integer(body, "repeat_last_n", d.repeat_last_n, -1),
            presence_penalty=_number(body, "presence_penalty", d.presence_penalty),
            frequency_penalty=_number(body, "frequency_penalty", d.frequency_penalty),
            seed=seed)
    except EdgeInferError as exc:
        raise bad_request(str(exc)) from None


def _response_fields(body: dict) -> tuple[str, ...]:
    value = _default(body.get("response_fields"), [])
    if not isinstance(value, list) or not all(isinstance(f, str) for f in value):
        raise bad_request("'response_fields' must be an array of strings")
    return tuple(value)


RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def _schema(value: Any, where: str) -> Constraint:
    """A JSON schema (an object, or its JSON text); {} means any JSON object, as in
    llama-server."""
    if isinstance(value, dict) and not value:
        return Constraint("json_object")
    if not isinstance(value, (dict, str)):
        raise bad_request(f"'{where}' must be a JSON schema object")
    try:
        return Constraint.json_schema(value)
    except EdgeInferError as exc:
        raise bad_request(f"'{where}': {exc}") from None


def _response_format(value: Any) -> tuple[Constraint | None, bool]:
    """OpenAI's response_format: text, json_object (optionally with a schema), json_schema
    ({name, schema, strict}); (the constraint, whether it is strict)."""
    if not isinstance(value, dict) or value.get("type") not in RESPONSE_FORMATS:
        raise bad_request('response_format type must be one of "text", "json_object" or '
                          f'"json_schema", got {value!r:.60}')
    kind = value["type"]
    if kind == "text":
        if value.get("schema") is not None and not isinstance(value["schema"], dict):
            raise bad_request("'response_format.schema' must be an object")
        return None, False
    if kind == "json_object":
        schema = value.get("schema")
        return (_schema(schema, "response_format.schema") if schema is not None
                else Constraint("json_object")), False
    wrapper = _default(value.get("json_schema"), {})
    if not isinstance(wrapper, dict):
        raise bad_request("'response_format.json_schema' must be an object")
    strict = _boolean(wrapper, "strict", False)
    return _schema(_default(wrapper.get("schema"), {}), "response_format.json_schema.schema"), \
        strict


def _constraint(body: dict) -> tuple[Constraint | None, bool]:
    """llama-server's `grammar` (GBNF, or Lark after %llguidance) and `json_schema`, or
    OpenAI's `response_format`: at most one of them."""
    given = [k for k in ("grammar", "json_schema", "response_format")
             if body.get(k) not in (None, "")]
    if len(given) > 1 and not (given == ["grammar", "response_format"]
                               and body["response_format"] == {"type": "text"}):
        raise bad_request(f"Cannot use both {given[0]} and {given[1]}")
    if not given:
        return None, False
    value = body[given[0]]
    if given[0] == "grammar":
        if not isinstance(value, str):
            raise bad_request("'grammar' must be a string")
        return Constraint.from_llama_grammar(value), False
    if given[0] == "json_schema":
        return _schema(value, "json_schema"), False
    return _response_format(value)


def gen_params(body: dict, n_probs: int = 0, vocab: Vocab | None = None,
               defaults: GenParams = DEFAULTS) -> GenParams:
    """The generation settings shared by every completion route, over the server's
    `defaults`. `vocab` resolves logit_bias strings and ignore_eos; without it only token
    ids are taken."""
    _reject_unsupported(body)
    n_predict = defaults.n_predict
    for key in ("max_completion_tokens", "max_tokens", "n_predict"):  # later keys win
        if body.get(key) is not None:
            n_predict = _integer(body, key, N_PREDICT, -1)
    stream_options = _default(body.get("stream_options"), {})
    if not isinstance(stream_options, dict):
        raise bad_request("'stream_options' must be an object")
    n_probs = _integer(body, "n_probs", n_probs, 0, 100)
    ignore_eos = _boolean(body, "ignore_eos", False)
    constraint, strict = _constraint(body)
    return GenParams(
        sampling=_sampling(body, defaults.sampling),
        logit_bias=_logit_bias(body, vocab, ignore_eos), n_predict=n_predict, stop=_stop(body),
        stream=_boolean(body, "stream", False), n_probs=n_probs, logprobs=n_probs > 0,
        cache_prompt=_boolean(body, "cache_prompt", True),
        ignore_eos=ignore_eos, id_slot=_integer(body, "id_slot", -1, -1),
        include_usage=_boolean(stream_options, "include_usage", False),
        return_tokens=_boolean(body, "return_tokens", False),
        timings_per_token=_boolean(body, "timings_per_token", False),
        sse_ping_interval=_ping_interval(body), n_cmpl=_n_cmpl(body),
        post_sampling_probs=_boolean(body, "post_sampling_probs", False),
        return_progress=_boolean(body, "return_progress", False),
        response_fields=_response_fields(body),
        verbose=_boolean(body, "verbose", defaults.verbose), constraint=constraint,
        strict=strict, spec_n_max=_integer(body, "speculative.n_max", -1, 0),
        spec_n_min=_integer(body, "speculative.n_min", -1, 0),
        spec_p_min=_number(body, "speculative.p_min", -1.0, 0.0, 1.0))


def _ping_interval(body: dict) -> float | None:
    """-1 or 0: no pings; a positive value under SSE_PING_FLOOR is raised to it (llama-server
    truncates it to whole seconds, so to 0: no pings)."""
    value = _number(body, "sse_ping_interval", math.nan, -1.0, INT32_MAX)
    if math.isnan(value):
        return None
    return max(value, SSE_PING_FLOOR) if value > 0 else 0.0


# -- prompts --------------------------------------------------------------------------------
def _as_id(value: Any) -> Any:
    """An integral number as an int (JSON Schema's integer: 5.0 is one, as `_integer`
    reads it); anything else unchanged."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompt_pieces(value: Any) -> list[PromptPiece]:
    if isinstance(value, dict):  # {"prompt_string": ..., "multimodal_data": [...]}
        if value.get("multimodal_data") is not None:
            raise bad_request("Multimodal data provided, but model does not support "
                              "multimodal requests.")
        text = value.get("prompt_string")
        if isinstance(text, (str, list)):
            return _prompt_pieces(text)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        pieces = [_as_id(p) for p in value]
        if all(isinstance(p, str) or _is_id(p) for p in pieces):
            return pieces
    raise bad_request("'prompt' must be a string, an array of token ids or strings, "
                      "an object with a 'prompt_string', or an array of those")


def parse_prompts(value: Any) -> list[list[PromptPiece]]:
    """llama-server's tokenize_input_prompts shapes: "text", [ids], [12, "text"],
    {"prompt_string": "text"}, or an array of those without ids at its top level (one
    completion each)."""
    if value is None:
        raise bad_request("'prompt' is required")
    if not (isinstance(value, list) and len(value) > 1
            and not any(_is_id(_as_id(p)) for p in value)):
        return [_prompt_pieces(value[0] if isinstance(value, list) and len(value) == 1
                               and isinstance(value[0], (list, dict)) else value)]
    if len(value) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request, got {len(value)}")
    return [_prompt_pieces(p) for p in value]


def parse_completion(body: dict, oai: bool, vocab: Vocab | None = None,
                     defaults: GenParams = DEFAULTS) -> CompletionRequest:
    """/completion (native) or /v1/completions (OpenAI: `logprobs: N` means n_probs)."""
    n_probs = 0
    if oai:
        if _boolean(body, "echo", False):
            raise bad_request("Only no echo is supported")
        for key in ("best_of", "suffix"):
            if body.get(key) is not None:
                raise bad_request(f"Unsupported param: {key}")
        n_probs = _integer(body, "logprobs", 0, 0, 100)
        _check_model(body)
    return CompletionRequest(parse_prompts(body.get("prompt")),
                             gen_params(body, n_probs, vocab, defaults))


# -- tokenizer routes -------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenizeRequest:
    """/tokenize: text (tokenized as given) or prompt pieces (as a completion prompt)."""

    content: str | list[PromptPiece]
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


def parse_tokenize(body: dict) -> TokenizeRequest:
    content = body.get("content")
    if not isinstance(content, (str, list)):
        raise bad_request("'content' must be a string or an array")
    pieces = content if isinstance(content, str) or not content else _prompt_pieces(content)
    return TokenizeRequest(pieces, _boolean(body, "add_special", False),
                           _boolean(body, "parse_special", True),
                           _boolean(body, "with_pieces", False))


def parse_token_ids(body: dict, n_vocab: int) -> list[int]:
    """/detokenize's `tokens`: ids in the vocabulary; absent or null: none."""
    tokens = _default(body.get("tokens"), [])
    tokens = [_as_id(t) for t in tokens] if isinstance(tokens, list) else None
    if tokens is None or not all(_is_id(t) and 0 <= t < n_vocab for t in tokens):
        raise bad_request("'tokens' must be an array of token ids in the vocabulary")
    return tokens


# -- chat -----------------------------------------------------------------------------------
def check_chat_fields(body: dict) -> None:
    """The types of the fields the chat layer reads (llama-server falls back to the default
    on a wrong type; here it is a 400, as for every other field)."""
    _boolean(body, "add_generation_prompt", True)
    _boolean(body, "parallel_tool_calls", True)
    _boolean(body, "echo", False)
    for key, kinds, what in (("continue_final_message", (bool, str), "a boolean or a string"),
                             ("chat_template_kwargs", (dict,), "an object"),
                             ("reasoning_format", (str,), "a string"),
                             ("tool_choice", (str, dict), "a string or an object")):
        value = body.get(key)
        if value is not None and not isinstance(value, kinds):
            raise bad_request(f"'{key}' must be {what}, got {value!r:.40}")


def parse_chat(body: dict, vocab: Vocab | None = None,
               defaults: GenParams = DEFAULTS) -> ChatRequest:
    """The generation fields of a chat request; its messages, tools and template fields are
    the chat layer's (edgeinfer.chat.chat_prompt)."""
    check_chat_fields(body)
    _check_model(body)
    logprobs = _boolean(body, "logprobs", False)
    top = body.get("top_logprobs")
    if top is not None and not logprobs:
        raise bad_request("top_logprobs requires logprobs to be set to true")
    n_probs = _integer(body, "top_logprobs", 0, 0, 100) if logprobs else 0
    params = replace(gen_params(body, n_probs, vocab, defaults), logprobs=logprobs)
    return ChatRequest(params, logprobs)
