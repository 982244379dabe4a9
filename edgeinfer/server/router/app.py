"""The router's HTTP side: its own routes (/health, /models, /v1/models, /models/load,
/models/unload, and the chat page at / unless --no-ui) and every other request proxied to the
worker of the model it names (the JSON body's `model`, or `?model=` on a GET), streamed
through without buffering."""

from __future__ import annotations

import asyncio
import json
import re
import time
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from edgeinfer.server.apis import sse_frame
from edgeinfer.server.errors import ApiError
from edgeinfer.server.router.workers import Pool, Worker
from edgeinfer.server.routes.ui import add_ui_routes
from edgeinfer.server.security import AccessMiddleware, AccessPolicy, key_matches, request_key

HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding"}
DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
WORKER_STOPPED = ApiError(503, "the model's worker stopped", "unavailable_error")
UNITS = {None: 1.0, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value) -> float | None:
    """Ollama's keep_alive: seconds, or "30s", "5m", "1h"; negative keeps the model loaded."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ApiError(400, "keep_alive must be a number of seconds or a duration like '5m'")
    m = DURATION.match(str(value))
    if not m:
        raise ApiError(400, f"keep_alive: cannot read '{value}' as a duration")
    return float(m.group(1)) * UNITS[m.group(2)]


def create_router_app(pool: Pool, api_keys: tuple[str, ...], ui: bool = True,
                      access: AccessPolicy | None = None) -> FastAPI:
    """The router's app. With `access`, the Host and Origin rules apply here, at the edge,
    and requests reach the workers without their Origin (the workers see the router's own
    Host, so a page of the router's address would look cross-origin to them); without it
    (Ray Serve's engine replicas), the workers check the Origin themselves."""
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
    keep_alive: dict[str, float | None] = {}  # per-model overrides from requests

    async def reaper() -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for w in list(pool.workers.values()):
                limit = keep_alive.get(w.name)
                limit = pool.keep_alive if limit is None else limit
                if (limit >= 0 and w.status == "loaded" and w.in_flight == 0
                        and now - w.last_used >= limit):
                    async with w.lock:
                        await pool.stop(w)

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(reaper())
        yield
        task.cancel()
        await client.aclose()
        await pool.close()

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    if access is not None:
        app.add_middleware(AccessMiddleware, policy=access)  # Host, Origin, CORS preflights

    def error(exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    def check_key(request: Request) -> None:
        if api_keys and not key_matches(api_keys, request_key(request.headers)):
            raise ApiError(401, "Invalid API Key")

    def entry(w: Worker) -> dict:
        return {"id": w.name, "object": "model", "owned_by": "edgeinfer", "created": 0,
                "path": str(w.path), "status": {"value": w.status}}

    def named(name) -> Worker:
        if not isinstance(name, str) or not name:
            raise ApiError(400, "the request must name a model ('model'); available: "
                                + ", ".join(sorted(pool.workers)))
        w = pool.workers.get(name) or pool.workers.get(name.removesuffix(".gguf"))
        if w is None:
            raise ApiError(404, f"model '{name}' not found; available: "
                                + ", ".join(sorted(pool.workers)))
        return w

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/models")
    @app.get("/v1/models")
    async def models(request: Request):
        try:
            check_key(request)
        except ApiError as exc:
            return error(exc)
        return {"object": "list", "data": [entry(w) for w in pool.workers.values()]}

    async def load_or_unload(request: Request, load: bool):
        try:
            check_key(request)
            try:
                body = json.loads(await request.body() or b"{}")
            except ValueError:
                raise ApiError(400, "the body is not valid JSON") from None
            w = named(body.get("model") if isinstance(body, dict) else None)
            if load:
                await pool.ready(w.name)
            else:
                async with w.lock:
                    await pool.stop(w)
            return {"success": True}
        except ApiError as exc:
            return error(exc)
        except RuntimeError as exc:
            return error(ApiError(503, str(exc), "unavailable_error"))

    @app.post("/models/load")
    async def load(request: Request):
        return await load_or_unload(request, True)

    @app.post("/models/unload")
    async def unload(request: Request):
        return await load_or_unload(request, False)

    if ui:  # before the proxy's catch-all
        add_ui_routes(app)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "OPTIONS"])
    async def proxy(path: str, request: Request):
        body = await request.body()
        try:
            if request.method == "POST":
                try:
                    parsed = json.loads(body) if body else {}
                except ValueError:
                    raise ApiError(400, "the body is not valid JSON") from None
                parsed = parsed if isinstance(parsed, dict) else {}
                name = parsed.get("model")
                wanted_keep = parse_keep_alive(parsed.get("keep_alive"))
            else:
                name, wanted_keep = request.query_params.get("model"), None
            if name is None and len(pool.workers) == 1:
                name = next(iter(pool.workers))
            w = named(name)
            if wanted_keep is not None:
                keep_alive[w.name] = wanted_keep
            w = await pool.ready(w.name)
        except ApiError as exc:
            return error(exc)
        except RuntimeError as exc:
            return error(ApiError(503, str(exc), "unavailable_error"))
        dropped = HOP_HEADERS | ({"origin"} if access is not None else set())
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in dropped]
        url = f"{w.url}/{path}" + (f"?{request.url.query}" if request.url.query else "")
        w.in_flight += 1
        try:
            upstream = await client.send(client.build_request(
                request.method, url, headers=headers, content=body), stream=True)
        except httpx.HTTPError as exc:
            w.in_flight -= 1
            return error(ApiError(503, f"model '{w.name}' is unavailable: "
                                       f"{type(exc).__name__}", "unavailable_error"))

        async def relay():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            except httpx.HTTPError:  # the worker died mid-stream: end it with an error
                yield sse_frame(WORKER_STOPPED.body()).encode()
            finally:
                await upstream.aclose()
                w.in_flight -= 1
                w.last_used = time.monotonic()

        out_headers = {k: v for k, v in upstream.headers.items()
                       if k.lower() not in HOP_HEADERS}
        return StreamingResponse(relay(), status_code=upstream.status_code,
                                 headers=out_headers)

    return app
