"""/completion (llama-server's native API) and /v1/completions (OpenAI's)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edgeinfer.server import responses as fmt
from edgeinfer.server.engine import FinalEvent, ProgressEvent
from edgeinfer.server.params import GenParams, parse_completion
from edgeinfer.server.runs import (
    check_prompt,
    collect,
    each_completion,
    encode_prompts,
    start_run,
    stream,
)
from edgeinfer.server.state import Server


async def completion(server: Server, request: Request) -> Response:
    """POST /completion: llama-server's native API."""
    req = parse_completion(await server.read_json(request), oai=False, vocab=server.vocab,
                           defaults=server.defaults)
    prompts = each_completion(server, await encode_prompts(server, req.prompts), req.params)
    for ids in prompts:
        check_prompt(server, ids)
    tok = server.model.tokenizer
    ctxs = [fmt.NativeContext(server.model_id, req.params, server.engine.n_ctx, server.piece,
                              tok.decode(ids, special=True)) for ids in prompts]
    run = await start_run(server, prompts, req.params)
    if req.params.stream:
        results = [fmt.Result(len(ids)) for ids in prompts]

        def chunks(index: int, event: Any) -> list[dict]:
            if isinstance(event, ProgressEvent):
                return [fmt.native_progress_chunk(event, index)]
            results[index].add(event)
            if isinstance(event, FinalEvent):
                return [fmt.native_reply(results[index], index, ctxs[index], stream=True)]
            return [fmt.native_token_chunk(event, index, len(prompts[index]), ctxs[index])]
        return stream(run, chunks, False, server.ping_interval(req.params))
    results = await collect(request, run)
    replies = [fmt.native_reply(r, i, ctxs[i], stream=False) for i, r in enumerate(results)]
    return JSONResponse(replies[0] if len(replies) == 1 else replies)


def verbose_field(server: Server, params: GenParams, ids: list[int], result: fmt.Result) -> dict:
    """__verbose: the native reply of the first choice (llama-server's `verbose` field)."""
    ctx = fmt.NativeContext(server.model_id, params, server.engine.n_ctx, server.piece,
                            server.model.tokenizer.decode(ids, special=True))
    return {"__verbose": fmt.native_reply(result, 0, ctx, stream=False)}


async def oai_completion(server: Server, request: Request) -> Response:
    """POST /v1/completions."""
    req = parse_completion(await server.read_json(request), oai=True, vocab=server.vocab,
                           defaults=server.defaults)
    prompts = each_completion(server, await encode_prompts(server, req.prompts), req.params)
    for ids in prompts:
        check_prompt(server, ids)
    meta = fmt.Meta(server.model_id)
    run = await start_run(server, prompts, req.params)
    if req.params.stream:
        def chunks(index: int, event: Any) -> list[dict]:
            return fmt.oai_completion_chunk(event, index, meta, server.piece)
        return stream(run, chunks, True, server.ping_interval(req.params))
    results = await collect(request, run)
    reply = fmt.oai_completion_reply(results, meta, server.piece)
    if req.params.verbose:
        reply.update(verbose_field(server, req.params, prompts[0], results[0]))
    return JSONResponse(reply)
