"""Where a chat's answers come from: the model in this process, its KV cache kept between
turns (LocalChat), or a running server, whose slots and prompt cache keep it (RemoteChat).
Both yield the answer's text pieces and leave the turn's figures in `last`; both raise
ContextFull when the conversation no longer fits."""

from __future__ import annotations

import json
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field

from edgeinfer.commands.chat.session import ContextFull, Conversation
from edgeinfer.decoder import Timings
from edgeinfer.errors import EdgeInferError
from edgeinfer.kv.prefix import common_prefix


@dataclass
class TurnStats:
    timings: Timings = field(default_factory=Timings)  # the turn's, as `run` prints them
    n_ctx: int = 0
    finish: str = ""

    def line(self) -> str:
        """The timings line after an answer."""
        t = self.timings
        return (f"prompt: {t.prompt_n} new tokens, {t.cache_n} cached, "
                f"{t.prompt_per_second:.1f} t/s | answer: {t.predicted_n} tokens, "
                f"{t.predicted_per_second:.1f} t/s")


class LocalChat:
    """The model loaded here; slot 0's KV cache holds `cached`, the tokens of the last turn."""

    def __init__(self, model):
        self.model, self.cached = model, []
        self.last = TurnStats(n_ctx=model.transformer.n_ctx)
        self.name = model.path.name

    def reply(self, conv: Conversation) -> Iterator[str]:
        from edgeinfer.generate import stream_generate
        from edgeinfer.sampling import make_sampler

        model, n_ctx = self.model, self.model.transformer.n_ctx
        ids = model.tokenize(model.apply_chat_template(conv.context()))
        room = conv.n_predict if conv.n_predict > 0 else min(256, n_ctx // 4)
        if len(ids) + room > n_ctx:
            raise ContextFull(f"{len(ids)} prompt tokens + {room} for the answer exceed the "
                              f"context ({n_ctx} tokens)")
        n_past = common_prefix(self.cached, ids)
        tokens: list[int] = []
        self.last, prefilled = TurnStats(n_ctx=n_ctx), False
        events = stream_generate(model, ids, make_sampler(conv.sampling), conv.n_predict,
                                 n_past=n_past)
        try:
            for event in events:
                prefilled, self.last.timings = True, event.timings
                if event.token is not None:
                    tokens.append(event.token)
                if event.finish_reason:
                    self.last.finish = event.finish_reason
                if event.text:
                    yield event.text
        finally:  # on Ctrl-C too: the prompt and every token but the last are in the cache
            events.close()
            self.cached = ids + tokens[:-1] if prefilled else ids[:n_past]


class RemoteChat:
    """A running server's /v1/chat/completions, streamed; the server reuses its cache."""

    def __init__(self, base: str, model_field: dict):
        from edgeinfer.commands.remote import _get

        self.base, self.model_field = base, model_field
        self.last = TurnStats()
        try:
            props = _get(base + "/props" + (f"?model={model_field['model']}"
                                            if model_field else ""), 30)
            self.n_ctx = int(props["default_generation_settings"]["n_ctx"])
            self.name = str(props.get("model_alias") or props.get("model_path") or base)
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
            self.n_ctx, self.name = 0, base

    def reply(self, conv: Conversation) -> Iterator[str]:
        from edgeinfer.commands.remote import _post

        s = conv.sampling
        body = {"messages": conv.context(), "stream": True, "cache_prompt": True,
                "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
                "min_p": s.min_p, "repeat_penalty": s.repeat_penalty,
                "repeat_last_n": s.repeat_last_n, "presence_penalty": s.presence_penalty,
                "frequency_penalty": s.frequency_penalty,
                "seed": -1 if s.seed is None else s.seed, **self.model_field}
        if conv.n_predict > 0:
            body["max_tokens"] = conv.n_predict
        self.last = TurnStats(n_ctx=self.n_ctx)
        try:
            stream = _post(self.base, "/v1/chat/completions", body)
        except EdgeInferError as exc:
            if "context" in str(exc):
                raise ContextFull(str(exc)) from None
            raise
        with stream:
            for raw in stream:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise EdgeInferError(chunk["error"].get("message", "the server failed"))
                if chunk.get("timings"):
                    self.last.timings = Timings.from_dict(chunk["timings"])
                for choice in chunk.get("choices", []):
                    if choice.get("finish_reason"):
                        self.last.finish = choice["finish_reason"]
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        yield text
