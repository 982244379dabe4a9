"""The two Ray Serve deployments: `Ingress` reads each HTTP request from Ray's proxy and
hands it, with its prompt's prefix chain, to the `Engine` deployment through a handle, so
that PrefixAffinityRouter can choose the replica; an `Engine` replica runs the router app
(server/router/) over the models, a worker process per model, and streams the answer back
chunk by chunk."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

from edgeinfer.ray.routing import prefix_chain
from edgeinfer.server.errors import ApiError
from edgeinfer.server.router.app import HOP_HEADERS

METHODS = ["GET", "POST", "PUT", "DELETE", "OPTIONS"]


@dataclass
class Forward:
    """An HTTP request as the ingress hands it on."""

    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes
    chain: tuple[int, ...]  # prefix_chain(body), what the request router reads


class Engine:
    """One replica: the router app over the catalog's models, called in-process as ASGI."""

    def __init__(self, catalog: dict[str, str], server_args: list[str], models_max: int):
        from edgeinfer.server.router.app import create_router_app
        from edgeinfer.server.router.workers import Pool

        pool = Pool({k: Path(v) for k, v in catalog.items()}, server_args, models_max, -1.0)
        self.app = create_router_app(pool, ())
        self.lifespan = None
        self.tag = f"{os.uname().nodename}:{os.getpid()}"

    async def started(self) -> None:
        if self.lifespan is None:  # the router's reaper task runs from the first request on
            self.lifespan = self.app.router.lifespan_context(self.app)
            await self.lifespan.__aenter__()

    async def __call__(self, req: Forward):
        """Yields (status, headers) first, then the body's chunks as the app sends them."""
        await self.started()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": req.method, "scheme": "http", "path": req.path,
                 "raw_path": req.path.encode(), "root_path": "",
                 "query_string": req.query.encode(), "client": ("127.0.0.1", 0),
                 "server": ("127.0.0.1", 80),
                 "headers": [(k.encode("latin-1"), v.encode("latin-1"))
                             for k, v in req.headers]}
        messages: asyncio.Queue = asyncio.Queue()
        sent = asyncio.Event()

        async def receive():
            if not sent.is_set():
                sent.set()
                return {"type": "http.request", "body": req.body, "more_body": False}
            await asyncio.Event().wait()  # no disconnect until the task is cancelled

        async def run():
            try:
                await self.app(scope, receive, messages.put)
            finally:
                await messages.put(None)

        task = asyncio.create_task(run())
        try:
            while (m := await messages.get()) is not None:
                if m["type"] == "http.response.start":
                    headers = [(k.decode("latin-1"), v.decode("latin-1"))
                               for k, v in m.get("headers", [])]
                    yield m["status"], headers + [("x-edgeinfer-replica", self.tag)]
                elif m["type"] == "http.response.body":
                    if m.get("body"):
                        yield bytes(m["body"])
                    if not m.get("more_body"):
                        break
        finally:
            task.cancel()


def make_ingress(engine_handle):
    """The ingress app: every route forwarded to the engine deployment, streamed back."""
    api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @api.api_route("/{path:path}", methods=METHODS)
    async def forward(path: str, request: Request):
        body = await request.body()
        req = Forward(request.method, "/" + path, request.url.query,
                      [(k, v) for k, v in request.headers.items()
                       if k.lower() not in HOP_HEADERS], body, prefix_chain(body))
        answer = engine_handle.options(stream=True).remote(req)
        try:
            status, headers = await answer.__anext__()
        except Exception as exc:  # the replica died before answering
            error = ApiError(503, f"no replica answered: {type(exc).__name__}",
                             "unavailable_error")
            return JSONResponse(error.body(), status_code=error.status)

        async def rest():
            try:
                async for chunk in answer:
                    yield chunk
            except Exception:  # the replica died mid-stream: end the stream with an error
                yield (b'data: {"error": {"code": 503, "message": "the replica stopped",'
                       b' "type": "unavailable_error"}}\n\n')

        return StreamingResponse(rest(), status_code=status, headers={
            k: v for k, v in headers if k.lower() not in HOP_HEADERS})

    return api


def ingress_deployment(name: str):
    """The ingress deployment (its replicas hold a handle to the engine deployment)."""

    class Ingress:
        def __init__(self, engine):
            self.engine = engine

        def __serve_build_asgi_app__(self):
            return make_ingress(self.engine)

    return serve.deployment(serve.ingress()(Ingress), name=name,
                            ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024)
