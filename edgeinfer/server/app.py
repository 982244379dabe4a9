"""The HTTP layer: it only translates. JSON is parsed into typed requests at the edge
(params.py), generation is handed to the engine thread, and events are formatted as
llama-server replies (responses.py). Routes are one flat table (`ROUTES`); every handler runs
inside `_endpoint`, the one place that answers 503 while loading, checks the API key and turns
exceptions into the OpenAI-shaped error envelope.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from edgeinfer.errors import EdgeInferError
from edgeinfer.server import responses as fmt
from edgeinfer.server.engine import Engine, ErrorEvent, FinalEvent, Job, ProgressEvent, TokenEvent
from edgeinfer.server.errors import (
    BAD_KEY,
    LOADING,
    NOT_FOUND,
    ApiError,
    bad_request,
    context_exceeded,
)
from edgeinfer.server.json_body import MAX_BODY_BYTES, read_json_body
from edgeinfer.server.metrics import Scraper
from edgeinfer.server.openapi import openapi_schema
from edgeinfer.server.params import (
    GenParams,
    PromptPiece,
    Vocab,
    parse_chat,
    parse_completion,
    parse_messages,
    parse_token_ids,
    parse_tokenize,
)
from edgeinfer.server.security import (
    AccessMiddleware,
    AccessPolicy,
    key_matches,
    path_redactor,
    public_error,
    request_key,
)
from edgeinfer.server.shutdown import Gate, GateMiddleware

log = logging.getLogger("edgeinfer.server")
PUBLIC = frozenset({"/health", "/v1/health", "/models", "/v1/models", "/"})
SSE_HEADERS = {"X-Accel-Buffering": "no", "Cache-Control": "no-cache"}


@dataclass
class Server:
    """What the handlers share: the engine plus the server's settings."""

    engine: Engine
    model_path: Path
    alias: str | None = None
    api_keys: tuple[str, ...] = ()
    metrics: bool = False
    max_body_bytes: int = MAX_BODY_BYTES
    sse_ping_interval: float = 30.0  # the default of the requests' sse_ping_interval
    access: AccessPolicy = field(default_factory=AccessPolicy)
    gate: Gate = field(default_factory=Gate)
    start_time: float = field(default_factory=time.time)

    @property
    def model(self):
        return self.engine.model

    @property
    def model_id(self) -> str:
        """The alias, else the file name: the model's path is never shown (llama-server's
        fallback when the model has no name is the file name too)."""
        return self.alias or self.model_path.name

    @cached_property
    def redact(self) -> Callable[[str], str]:
        return path_redactor(self.model_path)

    @cached_property
    def scraper(self) -> Scraper:
        return Scraper(self.engine, self.start_time)

    @cached_property
    def mailbox(self) -> Mailbox:
        """Created on first use, inside the server's event loop."""
        return Mailbox(asyncio.get_running_loop())

    @cached_property
    def vocab(self) -> Vocab:
        """What request parsing needs of the model: logit_bias strings are tokenized as
        llama-server's common_tokenize(vocab, text, false) does (no BOS, no specials)."""
        tok = self.model.tokenizer
        return Vocab(tok.n_vocab, tuple(sorted(tok.eog_ids)),
                     lambda text: tok.encode(text, add_special=False, parse_special=False))

    def piece(self, token: int) -> bytes:
        return self.model.tokenizer.token_to_piece(token, special=True)

    def ping_interval(self, params: GenParams) -> float:
        """The request's sse_ping_interval, else the server's; <= 0: no pings."""
        value = params.sse_ping_interval
        return self.sse_ping_interval if value is None else value


# -- request plumbing ----------------------------------------------------------------------
async def read_json(server: Server, request: Request) -> dict:
    body = await read_json_body(request, server.max_body_bytes)
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    return body


def _check_key(server: Server, request: Request) -> None:
    if not key_matches(server.api_keys, request_key(request.headers)):
        raise BAD_KEY


def error_response(exc: Exception) -> JSONResponse:
    """The single exception -> envelope mapping."""
    if isinstance(exc, ApiError):
        error = exc
    elif isinstance(exc, EdgeInferError):
        error = bad_request(str(exc))
    else:
        log.exception("request failed")
        error = ApiError(500, f"{type(exc).__name__}: {exc}")
    return JSONResponse(error.body(), status_code=error.status)


Handler = Callable[[Server, Request], Awaitable[Response]]


class ClientGone(Exception):
    """The client hung up while its (non-stream) reply was being generated."""

    def __init__(self, n_tokens: int):
        super().__init__(f"client disconnected after {n_tokens} tokens")
        self.n_tokens = n_tokens


def _endpoint(server: Server, path: str, handler: Handler):
    async def route(request: Request) -> Response:
        try:
            if not server.engine.ready.is_set():
                raise LOADING
            if server.api_keys and path not in PUBLIC:
                _check_key(server, request)
            return await handler(server, request)
        except (ClientGone, ClientDisconnect) as exc:  # nobody reads a reply: one log line
            n_tokens = exc.n_tokens if isinstance(exc, ClientGone) else 0
            log.info("client disconnected: %s %s after %d tokens", request.method, path,
                     n_tokens)
            return Response(status_code=499)
        except Exception as exc:  # noqa: BLE001 - the one place errors become replies
            return error_response(public_error(exc, server.redact))
    return route


# -- prompts -------------------------------------------------------------------------------
def encode_prompt(server: Server, pieces: list[PromptPiece]) -> list[int]:
    """Text pieces are tokenized (specials parsed; BOS only when the prompt starts with
    text and the model adds BOS), ids are kept as given (llama-server)."""
    tok, ids = server.model.tokenizer, []
    for i, piece in enumerate(pieces):
        if isinstance(piece, str):
            ids += tok.encode(piece, add_special=i == 0, parse_special=True)
        elif 0 <= piece < tok.n_vocab:
            ids.append(piece)
        else:
            raise bad_request(f"token id {piece} is outside the vocabulary ({tok.n_vocab})")
    return ids


async def encode_prompts(server: Server, prompts: list[list[PromptPiece]]) -> list[list[int]]:
    """Tokenizing a long prompt takes milliseconds per thousand tokens of Python: it runs in
    a worker thread, so the event loop keeps streaming the other requests meanwhile."""
    return await asyncio.to_thread(lambda: [encode_prompt(server, p) for p in prompts])


def each_completion(server: Server, prompts: list[Any], params: GenParams) -> list[Any]:
    """Each prompt n_cmpl times, in llama-server's order (a prompt's completions together);
    n_cmpl is at most the number of slots, as there."""
    n_slots = server.engine.n_slots
    if not 1 <= params.n_cmpl <= n_slots:
        raise bad_request(f"Field 'n_cmpl': Value must be between 1 <= value <= {n_slots}, "
                          f"but got {params.n_cmpl}")
    return [p for p in prompts for _ in range(params.n_cmpl)]


def check_prompt(server: Server, ids: list[int]) -> None:
    if not ids:
        raise bad_request("the prompt is empty")
    if len(ids) >= server.engine.n_ctx:
        raise context_exceeded(len(ids), server.engine.n_ctx)


def render_chat(server: Server, messages: list[dict], add_generation_prompt: bool = True,
                **kwargs: Any) -> str:
    """The chat template; a final assistant message is continued, not closed (prefill)."""
    model = server.model
    if messages[-1]["role"] == "assistant" and add_generation_prompt:
        head = model.apply_chat_template(messages[:-1], True, **kwargs) \
            if len(messages) > 1 else ""
        return head + messages[-1]["content"]
    return model.apply_chat_template(messages, add_generation_prompt, **kwargs)


# -- running jobs --------------------------------------------------------------------------
class Mailbox:
    """Hands engine events to the event loop, waking it once per batch of events rather
    than once per event (one engine step emits an event for every running sequence)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.items, self.lock = loop, [], threading.Lock()

    def post(self, put: Callable[[Any], None], item: Any) -> None:
        with self.lock:
            self.items.append((put, item))
            wake = len(self.items) == 1
        if wake:
            self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self.lock:
            items, self.items = self.items, []
        for put, item in items:
            put(item)


class Run:
    """Jobs of one request and the asyncio queue their events arrive on."""

    def __init__(self, server: Server, prompts: list[list[int]], params: GenParams):
        if params.id_slot >= server.engine.n_slots:
            raise bad_request(f"id_slot {params.id_slot} does not exist "
                              f"({server.engine.n_slots} slots)")
        self.engine, self.queue = server.engine, asyncio.Queue()
        self.jobs = [Job(ids, params, self._sink(server.mailbox, i))
                     for i, ids in enumerate(prompts)]
        self.open = set(range(len(self.jobs)))
        self.n_tokens = 0  # token events delivered so far, all jobs together
        self.finished = False  # the whole reply was sent
        self.client_gone = False  # the client hung up (non-stream: seen by the watcher)
        self._getter: asyncio.Future | None = None
        for job in self.jobs:
            self.engine.submit(job)

    def _sink(self, mailbox: Mailbox, index: int):
        put = self.queue.put_nowait
        return lambda event: mailbox.post(put, (index, event))

    async def next(self, timeout: float | None = None) -> tuple[int, Any] | None:
        """The next (job index, event), or None after `timeout` seconds without one. The
        pending get survives a timeout, so no event is lost to it."""
        if self._getter is None:
            self._getter = asyncio.ensure_future(self.queue.get())
        done, _ = await asyncio.wait({self._getter}, timeout=timeout)
        if not done:
            return None
        getter, self._getter = self._getter, None
        if getter.cancelled():  # cancel() ran meanwhile: the client went away
            self.client_gone = True
            raise ClientGone(self.n_tokens)
        index, event = getter.result()
        if isinstance(event, (FinalEvent, ErrorEvent)):
            self.open.discard(index)
        elif isinstance(event, TokenEvent):
            self.n_tokens += 1
        return index, event

    def cancel(self) -> None:
        for index in self.open:
            self.engine.cancel(self.jobs[index])
        self.open.clear()
        if self._getter is not None:
            self._getter.cancel()


async def _watch_disconnect(request: Request, run: Run) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    run.client_gone = True
    run.cancel()


async def collect(request: Request, run: Run) -> list[fmt.Result]:
    """Wait for every job to finish (non-stream); a disconnect cancels them."""
    results = [fmt.Result(len(job.prompt)) for job in run.jobs]
    watcher = asyncio.create_task(_watch_disconnect(request, run))
    try:
        while run.open:
            index, event = await run.next()
            if isinstance(event, ErrorEvent):
                raise event.error
            results[index].add(event)
    finally:
        watcher.cancel()
        run.cancel()
    if run.client_gone:
        raise ClientGone(run.n_tokens)
    run.finished = True
    return results


Chunker = Callable[[int, Any], list[dict]]


class EventStream(StreamingResponse):
    """The SSE reply of a Run. A client that hangs up cancels the Run's jobs and costs one
    log line: starlette cancels the body when it hears `http.disconnect` (ASGI < 2.4, as
    uvicorn speaks), or the send fails with OSError / ClientDisconnect (ASGI >= 2.4)."""

    def __init__(self, run: Run, body: AsyncIterator[str]):
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self.run = run

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (OSError, ClientDisconnect):
            pass
        finally:
            self.run.cancel()
        if not self.run.finished:
            log.info("client disconnected: %s %s after %d tokens", scope["method"],
                     scope["path"], self.run.n_tokens)


def stream(run: Run, chunks: Chunker, done_marker: bool, ping: float) -> EventStream:
    """SSE: each event's chunks as `data:` lines, `:` pings while nothing comes, `[DONE]`
    on the /v1 routes. Closing the connection cancels the remaining jobs."""
    timeout = ping if ping > 0 else None

    async def body() -> AsyncIterator[str]:
        try:
            while run.open:
                item = await run.next(timeout)
                if item is None:
                    yield ":\n\n"  # keep-alive comment, ignored by SSE parsers
                    continue
                index, event = item
                if isinstance(event, ErrorEvent):
                    yield fmt.sse(event.error.body())
                    break
                yield "".join(fmt.sse(c) for c in chunks(index, event))
            else:
                if done_marker:
                    yield fmt.sse("[DONE]")
            run.finished = True
        finally:
            run.cancel()

    return EventStream(run, body())


# -- generation routes ---------------------------------------------------------------------
async def completion(server: Server, request: Request) -> Response:
    """POST /completion: llama-server's native API."""
    req = parse_completion(await read_json(server, request), oai=False, vocab=server.vocab)
    prompts = each_completion(server, await encode_prompts(server, req.prompts), req.params)
    for ids in prompts:
        check_prompt(server, ids)
    tok = server.model.tokenizer
    ctxs = [fmt.NativeContext(server.model_id, req.params, server.engine.n_ctx, server.piece,
                              tok.decode(ids, special=True)) for ids in prompts]
    run = Run(server, prompts, req.params)
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


def _verbose(server: Server, params: GenParams, ids: list[int], result: fmt.Result) -> dict:
    """__verbose: the native reply of the first choice (llama-server's `verbose` field)."""
    ctx = fmt.NativeContext(server.model_id, params, server.engine.n_ctx, server.piece,
                            server.model.tokenizer.decode(ids, special=True))
    return {"__verbose": fmt.native_reply(result, 0, ctx, stream=False)}


async def oai_completion(server: Server, request: Request) -> Response:
    """POST /v1/completions."""
    req = parse_completion(await read_json(server, request), oai=True, vocab=server.vocab)
    prompts = each_completion(server, await encode_prompts(server, req.prompts), req.params)
    for ids in prompts:
        check_prompt(server, ids)
    meta = fmt.Meta(server.model_id)
    run = Run(server, prompts, req.params)
    if req.params.stream:
        def chunks(index: int, event: Any) -> list[dict]:
            return fmt.oai_completion_chunk(event, index, meta, server.piece)
        return stream(run, chunks, True, server.ping_interval(req.params))
    results = await collect(request, run)
    reply = fmt.oai_completion_reply(results, meta, server.piece)
    if req.params.verbose:
        reply.update(_verbose(server, req.params, prompts[0], results[0]))
    return JSONResponse(reply)


async def chat(server: Server, request: Request) -> Response:
    """POST /v1/chat/completions."""
    req = parse_chat(await read_json(server, request), vocab=server.vocab)
    text = render_chat(server, req.messages, req.add_generation_prompt, **req.template_kwargs)
    ids = await asyncio.to_thread(server.model.tokenize, text, True, True)
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
        reply.update(_verbose(server, req.params, ids, results[0]))
    return JSONResponse(reply)


# -- utility routes ------------------------------------------------------------------------
async def tokenize(server: Server, request: Request) -> Response:
    req = parse_tokenize(await read_json(server, request))
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
    tokens = parse_token_ids(await read_json(server, request), tok.n_vocab)
    return JSONResponse({"content": tok.decode(tokens, special=True)})


async def apply_template(server: Server, request: Request) -> Response:
    body = await read_json(server, request)
    return JSONResponse({"prompt": render_chat(server, parse_messages(body.get("messages")))})


async def health(server: Server, request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def models(server: Server, request: Request) -> Response:
    c = server.model.config
    meta = {"vocab_type": 1 if server.model.tokenizer.kind == "spm" else 2,
            "n_vocab": c.n_vocab, "n_ctx_train": c.n_ctx_train, "n_embd": c.n_embd,
            "n_params": _n_params(server.model_path), "size": _file_size(server.model_path),
            "n_ctx": server.engine.n_ctx}
    entry = {"id": server.model_id, "object": "model", "created": int(server.start_time),
             "owned_by": "llamacpp", "meta": meta}
    return JSONResponse({"object": "list", "data": [entry]})


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@lru_cache(maxsize=4)
def _n_params(path: Path) -> int:
    from edgeinfer.gguf_file import GGUFFile

    try:
        return sum(math.prod(t.shape) for t in GGUFFile(path).tensors.values())
    except (EdgeInferError, OSError):  # the file changed since it was loaded
        return 0


async def props(server: Server, request: Request) -> Response:
    tok, n_ctx = server.model.tokenizer, server.engine.n_ctx
    settings = fmt.settings_json(GenParams(), n_ctx)

    def token_text(token_id: int | None) -> str:
        return tok.token_text(token_id) if token_id is not None else ""
    return JSONResponse({
        "default_generation_settings": {"n_ctx": n_ctx, "params": settings},
        "total_slots": server.engine.n_slots, "model_alias": server.model_id,
        "model_path": server.model_path.name, "modalities": {"vision": False, "audio": False},
        "chat_template": server.model.chat_template or "", "bos_token": token_text(tok.bos_id),
        "eos_token": token_text(tok.eos_id), "build_info": fmt.BUILD_INFO,
        "endpoint_slots": True, "endpoint_props": False, "endpoint_metrics": server.metrics,
        "is_sleeping": False})


async def props_post(server: Server, request: Request) -> Response:
    raise ApiError(501, "This server does not support changing global properties. "
                        "No POST /props support.")


async def slots(server: Server, request: Request) -> Response:
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
    if not server.metrics:
        raise ApiError(501, "This server does not support metrics endpoint. "
                            "Start it with `--metrics`")
    return PlainTextResponse(server.scraper.render(), headers=server.scraper.headers(),
                             media_type="text/plain; version=0.0.4")


async def openapi(server: Server, request: Request) -> Response:
    return JSONResponse(openapi_schema(server.model.tokenizer.n_vocab, server.engine.n_slots,
                                       server.metrics, bool(server.api_keys), PUBLIC))


ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", "/health", health), ("GET", "/v1/health", health),
    ("GET", "/models", models), ("GET", "/v1/models", models),
    ("GET", "/props", props), ("POST", "/props", props_post),
    ("GET", "/slots", slots), ("GET", "/metrics", metrics),
    ("POST", "/completion", completion), ("POST", "/completions", completion),
    ("POST", "/v1/completions", oai_completion),
    ("POST", "/chat/completions", chat), ("POST", "/v1/chat/completions", chat),
    ("POST", "/tokenize", tokenize), ("POST", "/detokenize", detokenize),
    ("POST", "/apply-template", apply_template), ("GET", "/openapi.json", openapi),
]


def create_app(server: Server) -> FastAPI:
    app = FastAPI(title="edgeinfer", docs_url=None, redoc_url=None, openapi_url=None)
    for method, path, handler in ROUTES:
        methods = [method, "HEAD"] if method == "GET" else [method]  # uvicorn drops HEAD bodies
        app.add_api_route(path, _endpoint(server, path, handler), methods=methods,
                          include_in_schema=False)

    async def not_found(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code in (404, 405):
            return error_response(NOT_FOUND)
        return error_response(ApiError(exc.status_code, str(exc.detail)))
    app.add_exception_handler(StarletteHTTPException, not_found)
    app.add_middleware(GateMiddleware, gate=server.gate)  # the last added runs first:
    app.add_middleware(AccessMiddleware, policy=server.access)  # Host, Origin, then the gate
    return app
