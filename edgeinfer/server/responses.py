"""Engine events -> the JSON llama-server sends, per route (server-task.cpp to_json_*).

`Result` collects one job's events; the `*_reply` functions build non-stream bodies and the
`*_chunks` functions the stream chunks of each event. Nothing here touches the model: token
pieces come through the `piece` callable (token id -> bytes).
"""

from __future__ import annotations

import math
import secrets
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edgeinfer import __version__
from edgeinfer.server.events import FinalEvent, ProgressEvent, TokenEvent, TokenProbs
from edgeinfer.server.params import DEFAULT_SEED, GenParams

FLOAT_LOWEST = -3.4028234663852886e38  # llama-server sends this instead of -inf
# llama_build_info()'s form, "b<build number>-<commit>" (clients check the "b"); edgeinfer
# has no llama.cpp build number, so 0, as a llama.cpp built outside git reports
BUILD_INFO = f"b0-edgeinfer-{__version__}"
Piece = Callable[[int], bytes]
_ALNUM = string.ascii_letters + string.digits


def completion_id() -> str:
    return "chatcmpl-" + "".join(secrets.choice(_ALNUM) for _ in range(32))


@dataclass
class Meta:
    """What every OpenAI-shaped reply of one request repeats."""

    model: str
    id: str = field(default_factory=completion_id)
    created: int = field(default_factory=lambda: int(time.time()))

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": BUILD_INFO}


@dataclass
class Result:
    """Everything one job produced so far."""

    n_prompt: int
    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    probs: list[TokenProbs] = field(default_factory=list)
    final: FinalEvent | None = None

    def add(self, event: TokenEvent | FinalEvent | ProgressEvent) -> None:
        if isinstance(event, ProgressEvent):
            return
        if isinstance(event, TokenEvent):
            self.text.append(event.text)
            self.tokens.append(event.token)
            if event.probs is not None:
                self.probs.append(event.probs)
        else:
            self.text.append(event.text)
            self.final = event

    @property
    def content(self) -> str:
        return "".join(self.text)


def finish_reason(final: FinalEvent) -> str:
    return "stop" if final.stop_type in ("eos", "word") else "length"


def usage(final: FinalEvent) -> dict:
    return {"completion_tokens": final.n_decoded, "prompt_tokens": final.n_prompt,
            "total_tokens": final.n_decoded + final.n_prompt,
            "prompt_tokens_details": {"cached_tokens": final.n_cached}}


# what llama-server's task_params::to_json reports for the samplers edgeinfer does not have:
# their defaults (common/common.h), i.e. off
_ABSENT_SAMPLERS = {
    "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_n_sigma": -1.0,
    "xtc_probability": 0.0, "xtc_threshold": 0.1, "typical_p": 1.0, "dry_multiplier": 0.0,
    "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 64,
    "dry_sequence_breakers": ["\n", ":", "\"", "*"], "mirostat": 0, "mirostat_tau": 5.0,
    "mirostat_eta": 0.1, "adaptive_target": -1.0, "adaptive_decay": 0.9,
}


def logit_bias_json(logit_bias: tuple[tuple[int, float], ...]) -> list[dict]:
    """format_logit_bias: -inf is null, as nlohmann::json writes it."""
    return [{"bias": None if math.isinf(b) and b < 0 else b, "token": t} for t, b in logit_bias]


# what task_params::to_json(only_metrics=true) leaves out (/slots shows that form)
_NOT_METRICS = ("stop", "dry_sequence_breakers", "logit_bias", "grammar", "grammar_lazy",
                "grammar_triggers", "preserved_tokens")


def settings_json(params: GenParams, n_ctx: int, only_metrics: bool = False) -> dict:
    """llama-server's generation_settings / slot params (task_params::to_json)."""
    settings = _settings(params, n_ctx)
    if only_metrics:
        for key in _NOT_METRICS:
            del settings[key]
    return settings


def _settings(params: GenParams, n_ctx: int) -> dict:
    s = params.sampling
    return {
        "n_ctx": n_ctx, "seed": DEFAULT_SEED if s.seed is None else s.seed,
        "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
        "repeat_last_n": s.repeat_last_n, "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
        **_ABSENT_SAMPLERS,
        "stop": list(params.stop), "max_tokens": params.n_predict,
        "n_predict": params.n_predict, "n_keep": 0, "n_discard": 0,
        "ignore_eos": params.ignore_eos, "stream": params.stream,
        "logit_bias": logit_bias_json(params.logit_bias), "n_probs": params.n_probs,
        "min_keep": 0, "grammar": params.constraint.text if params.constraint else "",
        "grammar_lazy": False, "grammar_triggers": [],
        "preserved_tokens": [], "chat_format": "Content-only", "reasoning_format": "none",
        "reasoning_in_content": False, "generation_prompt": "",
        "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
        "speculative.types": "none", "timings_per_token": params.timings_per_token,
        "post_sampling_probs": params.post_sampling_probs, "backend_sampling": False,
        "lora": [],
        "cache_prompt": params.cache_prompt, "id_slot": params.id_slot, "speculative": False,
    }


# -- token probabilities -------------------------------------------------------------------
def _logprob(value: float) -> float:
    return max(FLOAT_LOWEST, value)


def _token_json(token: int, value: float, piece: Piece, post_sampling: bool) -> dict:
    data = piece(token)
    key, value = ("prob", value) if post_sampling else ("logprob", _logprob(value))
    return {"id": token, "token": data.decode("utf-8", errors="replace"),
            "bytes": list(data), key: value}


def probs_json(probs: list[TokenProbs], piece: Piece) -> list[dict]:
    """completion_probabilities (native) and logprobs.content (OpenAI) share this shape;
    with post_sampling_probs, probabilities: prob and top_probs."""
    out = []
    for p in probs:
        post = p.post_sampling
        top = [_token_json(t, v, piece, post) for t, v in p.top]
        out.append({**_token_json(p.token, p.logprob, piece, post),
                    "top_probs" if post else "top_logprobs": top})
    return out


def progress_json(event: ProgressEvent) -> dict:
    return {"total": event.total, "cache": event.cache, "processed": event.processed,
            "time_ms": int(event.time_ms)}


# -- native /completion --------------------------------------------------------------------
@dataclass
class NativeContext:
    model: str
    params: GenParams
    n_ctx: int
    piece: Piece
    prompt_text: str = ""


def native_token_chunk(event: TokenEvent, index: int, n_prompt: int,
                       ctx: NativeContext) -> dict:
    chunk = {"index": index, "content": event.text, "tokens": [event.token], "stop": False,
             "id_slot": event.slot, "tokens_predicted": event.n_decoded,
             "tokens_evaluated": n_prompt}
    if event.probs is not None and ctx.params.n_probs:
        chunk["completion_probabilities"] = probs_json([event.probs], ctx.piece)
    if event.timings is not None:
        chunk["timings"] = event.timings
    return chunk


def native_progress_chunk(event: ProgressEvent, index: int) -> dict:
    """A stream event while the prompt is read (return_progress)."""
    chunk = {"index": index, "content": "", "tokens": [], "stop": False,
             "id_slot": event.slot, "tokens_predicted": 0, "tokens_evaluated": event.total,
             "prompt_progress": progress_json(event)}
    if event.timings is not None:
        chunk["timings"] = event.timings
    return chunk


def pick_fields(fields: tuple[str, ...], reply: dict) -> dict:
    """json_get_nested_values: only `fields`, each under its own name; "a/b" is reply[a][b];
    a missing one is left out."""
    picked = {}
    for path in fields:
        value, found = reply, True
        for key in path.split("/"):
            if isinstance(value, dict) and key in value:
                value = value[key]
            else:
                found = False
                break
        if found:
            picked[path] = value
    return picked


def native_reply(result: Result, index: int, ctx: NativeContext, stream: bool) -> dict:
    """The final object: the whole reply without streaming, the last event with it."""
    final = result.final
    reply = {
        "index": index, "content": final.text if stream else result.content,
        "tokens": result.tokens if ctx.params.return_tokens and not stream else [],
        "id_slot": final.slot, "stop": True, "model": ctx.model,
        "tokens_predicted": final.n_decoded, "tokens_evaluated": final.n_prompt,
        "generation_settings": settings_json(ctx.params, ctx.n_ctx),
        "prompt": ctx.prompt_text, "has_new_line": "\n" in result.content,
        "truncated": final.truncated, "stop_type": final.stop_type,
        "stopping_word": final.stopping_word, "tokens_cached": final.tokens_cached,
        "timings": final.timings,
    }
    if ctx.params.n_probs and not stream:
        reply["completion_probabilities"] = probs_json(result.probs, ctx.piece)
    fields = ctx.params.response_fields
    return pick_fields(fields, reply) if fields else reply


# -- OpenAI /v1/completions ----------------------------------------------------------------
def oai_completion_reply(results: list[Result], meta: Meta, piece: Piece) -> dict:
    choices = []
    for i, r in enumerate(results):
        logprobs = {"content": probs_json(r.probs, piece)} if r.probs else None
        choices.append({"text": r.content, "index": i, "logprobs": logprobs,
                        "finish_reason": finish_reason(r.final)})
    finals = [r.final for r in results]
    body = {**meta.head("text_completion"), "choices": choices,
            "usage": _sum_usage(finals), "timings": finals[0].timings}
    return body


def oai_completion_chunk(event: TokenEvent | FinalEvent | ProgressEvent, index: int,
                         meta: Meta, piece: Piece) -> list[dict]:
    if isinstance(event, ProgressEvent):
        choice = {"text": "", "index": index, "logprobs": None, "finish_reason": None}
        return [{**meta.head("text_completion"), "choices": [choice],
                 "prompt_progress": progress_json(event)}]
    if isinstance(event, FinalEvent):
        choice = {"text": event.text, "index": index, "logprobs": None,
                  "finish_reason": finish_reason(event)}
        return [{**meta.head("text_completion"), "choices": [choice], "usage": usage(event),
                 "timings": event.timings}]
    if not event.text and event.probs is None:
        return []
    logprobs = {"content": probs_json([event.probs], piece)} if event.probs else None
    choice = {"text": event.text, "index": index, "logprobs": logprobs, "finish_reason": None}
    return [{**meta.head("text_completion"), "choices": [choice]}]


def _sum_usage(finals: list[FinalEvent]) -> dict:
    total = {"completion_tokens": 0, "prompt_tokens": 0, "total_tokens": 0,
             "prompt_tokens_details": {"cached_tokens": 0}}
    for final in finals:
        u = usage(final)
        for key in ("completion_tokens", "prompt_tokens", "total_tokens"):
            total[key] += u[key]
        total["prompt_tokens_details"]["cached_tokens"] += final.n_cached
    return total
