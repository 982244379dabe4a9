"""The HTTP layer: it only translates. JSON is parsed into typed requests at the edge
(params.py), generation is handed to the engine thread (runs.py), and events are formatted
as llama-server replies (responses.py, apis/). Routes are one flat table (`ROUTES`); every
handler runs inside `_endpoint`, the one place that answers 503 while loading, checks the API
key, keeps the model loaded (or wakes it) for the routes that need it, and turns exceptions
into the OpenAI-shaped error envelope.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from edgeinfer.errors import EdgeInferError
from edgeinfer.server.apis import vertex
from edgeinfer.server.errors import BAD_KEY, LOADING, NOT_FOUND, ApiError, bad_request
from edgeinfer.server.headers import HeaderCaseMiddleware
from edgeinfer.server.routes import chat, completions, info
from edgeinfer.server.routes import vertex as vertex_routes
from edgeinfer.server.routes.ui import add_ui_routes
from edgeinfer.server.runs import ClientGone, EventStream
from edgeinfer.server.security import AccessMiddleware, key_matches, public_error, request_key
from edgeinfer.server.shutdown import GateMiddleware
from edgeinfer.server.state import Server

log = logging.getLogger("edgeinfer.server")
PUBLIC = frozenset({"/health", "/v1/health", "/models", "/v1/models", "/"})
# answered from the model's snapshot: they neither need nor wake a sleeping model
SLEEP_SAFE = frozenset({"/health", "/v1/health", "/models", "/v1/models", "/props",
                        "/metrics", "/openapi.json"})

Handler = Callable[[Server, Request], Awaitable[Response]]
ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", "/health", info.health), ("GET", "/v1/health", info.health),
    ("GET", "/models", info.models), ("GET", "/v1/models", info.models),
    ("GET", "/props", info.props), ("POST", "/props", info.props_post),
    ("GET", "/slots", info.slots), ("GET", "/metrics", info.metrics),
    ("POST", "/completion", completions.completion),
    ("POST", "/completions", completions.completion),
    ("POST", "/v1/completions", completions.oai_completion),
    ("POST", "/chat/completions", chat.chat), ("POST", "/v1/chat/completions", chat.chat),
    ("POST", "/chat/completions/input_tokens", chat.chat_input_tokens),
    ("POST", "/v1/chat/completions/input_tokens", chat.chat_input_tokens),
    ("POST", "/apply-template", chat.apply_template),
    ("POST", "/v1/messages", chat.messages),
    ("POST", "/v1/messages/count_tokens", chat.count_tokens),
    ("POST", "/v1/responses", chat.responses), ("POST", "/responses", chat.responses),
    ("POST", "/v1/responses/input_tokens", chat.responses_input_tokens),
    ("POST", "/responses/input_tokens", chat.responses_input_tokens),
    ("POST", "/tokenize", info.tokenize), ("POST", "/detokenize", info.detokenize),
    ("GET", "/openapi.json", info.openapi),
]


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


def _check_key(server: Server, request: Request) -> None:
    if not key_matches(server.api_keys, request_key(request.headers)):
        raise BAD_KEY


async def _serve(server: Server, path: str, handler: Handler, request: Request) -> Response:
    if path in SLEEP_SAFE:
        return await handler(server, request)
    async with server.awake():
        response = await handler(server, request)
        if isinstance(response, EventStream):  # the model stays loaded until it ends
            response.hold(server.engine)
        return response


def _endpoint(server: Server, path: str, handler: Handler):
    async def route(request: Request) -> Response:
        try:
            if not server.engine.ready.is_set():
                raise LOADING
            if server.api_keys and path not in PUBLIC:
                _check_key(server, request)
            return await _serve(server, path, handler, request)
        except (ClientGone, ClientDisconnect) as exc:  # nobody reads a reply: one log line
            n_tokens = exc.n_tokens if isinstance(exc, ClientGone) else 0
            log.info("client disconnected: %s %s after %d tokens", request.method, path,
                     n_tokens)
            return Response(status_code=499)
        except Exception as exc:  # noqa: BLE001 - the one place errors become replies
            return error_response(public_error(exc, server.redact))
    return route


def _vertex_routes(server: Server) -> list[tuple[str, str, Handler]]:
    """Vertex AI's prediction route and health alias, with AIP_MODE=PREDICTION."""
    settings = server.vertex
    if not settings.enabled:
        return []
    try:
        vertex.PredictRoutes.from_routes(ROUTES).check(settings)
    except ValueError as exc:
        raise EdgeInferError(str(exc)) from None
    routes = [("POST", settings.predict_route, vertex_routes.predict)]
    if settings.health_route:
        routes.append(("GET", settings.health_route, info.health))
    return routes


def create_app(server: Server) -> FastAPI:
    app = FastAPI(title="edgeinfer", docs_url=None, redoc_url=None, openapi_url=None)
    server.routes = tuple(ROUTES)
    if server.settings.ui:  # static files: served while the model loads, with no key
        add_ui_routes(app)
    for method, path, handler in ROUTES + _vertex_routes(server):
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
    app.add_middleware(HeaderCaseMiddleware)  # outermost: every reply's header names
    server.app = app
    return app
