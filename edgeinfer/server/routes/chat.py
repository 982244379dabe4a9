"""/v1/chat/completions: messages through the chat template, the reply as OpenAI's."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edgeinfer.server import responses as fmt
from edgeinfer.server.engine import ProgressEvent
from edgeinfer.server.params import ChatRequest, parse_chat
from edgeinfer.server.routes.completions import verbose_field
from edgeinfer.server.runs import Run, check_prompt, collect, each_completion, stream
from edgeinfer.server.state import Server


def render_chat(server: Server, messages: list[dict], add_generation_prompt: bool = True,
                **kwargs: Any) -> str:
    """The chat template; a final assistant message is continued, not closed (prefill)."""
    model = server.model
    if messages[-1]["role"] == "assistant" and add_generation_prompt:
        head = model.apply_chat_template(messages[:-1], True, **kwargs) \
            if len(messages) > 1 else ""
        return head + messages[-1]["content"]
    return model.apply_chat_template(messages, add_generation_prompt, **kwargs)


def chat_prompt(server: Server, req: ChatRequest) -> str:
    return render_chat(server, req.messages, req.add_generation_prompt, **req.template_kwargs)


async def chat_ids(server: Server, req: ChatRequest) -> list[int]:
    """The prompt's tokens (specials parsed, BOS as the model says), in a worker thread."""
    text = chat_prompt(server, req)
    return await asyncio.to_thread(server.model.tokenize, text, True, True)


async def chat(server: Server, request: Request) -> Response:
    """POST /v1/chat/completions."""
    req = parse_chat(await server.read_json(request), vocab=server.vocab,
                     defaults=server.defaults)
    ids = await chat_ids(server, req)
    check_prompt(server, ids)
    meta = fmt.Meta(server.model_id)
    run = Run(server, each_completion(server, [ids], req.params), req.params)
    if req.params.stream:
        started: set[int] = set()

        def chunks(index: int, event: Any) -> list[dict]:
            if isinstance(event, ProgressEvent) or index in started:
                head = []
            else:
                head = [fmt.chat_role_chunk(meta, index)]
                started.add(index)
            return head + fmt.chat_chunks(event, meta, server.piece, req.params.include_usage,
                                          index)
        return stream(run, chunks, True, server.ping_interval(req.params))
    results = await collect(request, run)
    reply = fmt.chat_reply(results, meta, server.piece, req.logprobs)
    if req.params.verbose:
        reply.update(verbose_field(server, req.params, ids, results[0]))
    return JSONResponse(reply)


async def chat_input_tokens(server: Server, request: Request) -> Response:
    """POST /v1/chat/completions/input_tokens: the prompt's length in tokens, without
    running it (llama-server's handle_count_tokens)."""
    req = parse_chat(await server.read_json(request), vocab=server.vocab,
                     defaults=server.defaults)
    ids = await chat_ids(server, req)
    return JSONResponse({"input_tokens": len(ids), "object": "response.input_tokens"})


async def apply_template(server: Server, request: Request) -> Response:
    """POST /apply-template: the prompt a chat request would run, as text."""
    req = parse_chat(await server.read_json(request), vocab=server.vocab,
                     defaults=server.defaults)
    return JSONResponse({"prompt": chat_prompt(server, req)})
