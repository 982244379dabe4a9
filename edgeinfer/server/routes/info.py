"""The routes that describe the server (health, models, props, slots, metrics, the OpenAPI
description) and the tokenizer's (tokenize, detokenize). /health, /models, /props and
/metrics answer from the model's snapshot and never wake a sleeping model."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from edgeinfer.server import responses as fmt
from edgeinfer.server.errors import ApiError
from edgeinfer.server.model_info import ModelInfo
from edgeinfer.server.openapi import openapi_schema
from edgeinfer.server.params import parse_token_ids, parse_tokenize
from edgeinfer.server.runs import encode_prompt
from edgeinfer.server.state import Server


async def health(server: Server, request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def _model_entry(server: Server, info: ModelInfo) -> dict:
    meta = {"vocab_type": info.vocab_type, "n_vocab": info.n_vocab, "n_ctx": info.n_ctx,
            "n_ctx_train": info.n_ctx_train, "n_embd": info.n_embd, "n_params": info.n_params,
            "size": info.size}
    return {"id": server.model_id, "aliases": sorted(server.settings.aliases),
            "tags": sorted(server.settings.tags), "object": "model",
            "created": int(server.start_time), "owned_by": "llamacpp", "meta": meta}


async def models(server: Server, request: Request) -> Response:
    """OpenAI's list in `data`, and Ollama's in `models` (llama-server's get_res_models)."""
    name = server.model_id
    ollama = {"name": name, "model": name, "modified_at": "", "size": "", "digest": "",
              "type": "model", "description": "", "tags": [""],
              "capabilities": ["completion"], "parameters": "",
              "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                          "parameter_size": "", "quantization_level": ""}}
    return JSONResponse({"models": [ollama], "object": "list",
                         "data": [_model_entry(server, server.info)]})


async def props(server: Server, request: Request) -> Response:
    info, settings, chat = server.info, server.settings, server.engine.chat
    params = fmt.settings_json(server.defaults, info.n_ctx, only_metrics=True)
    extra = {}
    if settings.chat.jinja and chat.templates.tool_use is not None:
        extra["chat_template_tool_use"] = chat.templates.source("tool_use")
    return JSONResponse({**extra, 
        "default_generation_settings": {"params": params, "n_ctx": info.n_ctx},
        "total_slots": server.engine.n_slots, "model_alias": server.model_id,
        "model_path": info.file_name,
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": settings.slots_endpoint, "endpoint_props": False,
        "endpoint_metrics": settings.metrics, "ui": settings.ui,
        "chat_template": chat.templates.source(), "chat_template_caps": chat.caps(),
        "bos_token": info.bos_token,
        "eos_token": info.eos_token, "build_info": fmt.BUILD_INFO,
        "is_sleeping": server.engine.sleeping, "cors_proxy_enabled": False})


async def props_post(server: Server, request: Request) -> Response:
    raise ApiError(501, "This server does not support changing global properties. "
                        "No POST /props support.")


async def slots(server: Server, request: Request) -> Response:
    if not server.settings.slots_endpoint:
        raise ApiError(501, "This server does not support slots endpoint. "
                            "Start it with `--slots`")
    engine = server.engine
    if request.query_params.get("fail_on_no_slot") not in (None, "", "0", "false") and all(
            slot.job is not None for slot in engine.slots):
        raise ApiError(503, "no slot available")
    return JSONResponse([_slot_json(slot, engine.n_ctx) for slot in engine.slots])


def _slot_json(slot: Any, n_ctx: int) -> dict:
    """server_slot::to_json(only_metrics): the last task's fields once the slot has had one;
    an idle slot has nothing left to generate."""
    job, params = slot.job, slot.params  # read once: the engine thread may change them
    reply = {"id": slot.id, "n_ctx": n_ctx, "speculative": False,
             "is_processing": job is not None}
    if params is None:
        return reply
    busy = job is not None
    n_decoded = slot.n_decoded if busy else 0
    n_remain = params.n_predict - n_decoded if busy and params.n_predict >= 0 else -1
    n_tokens = len(slot.cache)
    return {**reply, "id_task": slot.task_id, "n_prompt_tokens": n_tokens,
            "n_prompt_tokens_processed": max(0, min(n_tokens, slot.n_prompt) - slot.n_cached),
            "n_prompt_tokens_cache": slot.n_cached,
            "params": fmt.settings_json(params, n_ctx, only_metrics=True),
            "next_token": [{"has_next_token": busy, "has_new_line": slot.has_new_line,
                            "n_remain": n_remain, "n_decoded": n_decoded}]}


async def metrics(server: Server, request: Request) -> Response:
    if not server.settings.metrics:
        raise ApiError(501, "This server does not support metrics endpoint. "
                            "Start it with `--metrics`")
    return PlainTextResponse(server.scraper.render(), headers=server.scraper.headers(),
                             media_type="text/plain; version=0.0.4")


async def openapi(server: Server, request: Request) -> Response:
    from edgeinfer.server.app import PUBLIC

    return JSONResponse(openapi_schema(server.info.n_vocab, server.engine.n_slots,
                                       server.settings.metrics, bool(server.api_keys), PUBLIC))


# -- the tokenizer ---------------------------------------------------------------------------
async def tokenize(server: Server, request: Request) -> Response:
    req = parse_tokenize(await server.read_json(request))
    if isinstance(req.content, str):
        ids = server.model.tokenizer.encode(req.content, add_special=req.add_special,
                                            parse_special=req.parse_special)
    else:
        ids = encode_prompt(server, req.content)
    if not req.with_pieces:
        return JSONResponse({"tokens": ids})
    return JSONResponse({"tokens": [{"id": i, "piece": _piece_json(server.piece(i))}
                                    for i in ids]})


def _piece_json(data: bytes) -> str | list[int]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


async def detokenize(server: Server, request: Request) -> Response:
    tok = server.model.tokenizer
    tokens = parse_token_ids(await server.read_json(request), tok.n_vocab)
    return JSONResponse({"content": tok.decode(tokens, special=True)})
