"""Chat APIs other than OpenAI's chat completions, as llama-server serves them: each module
converts its request into an OpenAI chat-completions body (which the one chat path then
validates, renders and runs) and renders the outcome in its own reply and stream shapes.

A module provides:

- `to_chat_body(body: dict) -> dict`: the request as an OpenAI chat-completions body; a bad
  request raises `ApiError` (server/errors.py) with a one-line message;
- a class built with `(meta: ChatMeta, request: dict)` (the original request, for fields a
  reply echoes) with `reply(outcome) -> dict` for a non-stream reply and, for a stream,
  `start() -> list[str]`, `update(diffs) -> list[str]`, `end(outcome) -> list[str]` and
  `error(body) -> list[str]`, each returning whole SSE frames (`event:`/`data:` lines and the
  blank line) in the order they are sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from edgeinfer.chat.message import ChatMsg


@dataclass(frozen=True)
class ChatMeta:
    """What each reply of one request repeats."""

    model: str  # the model's name as the API shows it
    id: str  # this reply's id (chatcmpl-..., msg_..., resp_...: each API picks its prefix)
    created: int  # Unix seconds


@dataclass(frozen=True)
class ChatOutcome:
    """One finished generation, parsed."""

    message: ChatMsg
    finish_reason: str  # OpenAI's: "stop", "length" or "tool_calls"
    n_prompt: int  # prompt tokens, cached ones included
    n_cached: int  # of them reused from the KV cache
    n_decoded: int  # generated tokens
    timings: dict  # llama-server's timings object
    stopping_word: str = ""  # the stop string that ended it (llama-server's stopping_word)


def sse_frame(data: dict | str, event: str | None = None) -> str:
    """One SSE frame with compact JSON, as llama-server writes them; `event` adds the
    `event:` line the Anthropic and Responses streams carry."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"),
                                                         ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n"
