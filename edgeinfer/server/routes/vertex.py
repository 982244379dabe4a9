"""Vertex AI's prediction route (`AIP_MODE=PREDICTION`, apis/vertex.py): each instance is
sent through this server's own app, middleware included, as the request its
`@requestFormat` names, with the outer request's headers; the replies, error bodies
included, come back in instance order (llama-server's register_gcp_compat)."""

from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edgeinfer.server.apis import vertex
from edgeinfer.server.errors import ApiError
from edgeinfer.server.state import Server


async def _call(app, request: Request, path: str, payload: dict) -> tuple[bytes, bool]:
    """One in-process ASGI request: (the reply's body, whether it was an event stream)."""
    body = json.dumps(payload).encode()
    headers = [(k, v) for k, v in request.scope["headers"]
               if k.lower() not in (b"content-length", b"content-type")]
    headers += [(b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode())]
    scope = {**request.scope, "path": path, "raw_path": path.encode(), "query_string": b"",
             "method": "POST", "headers": headers}
    sent, parts, stream = False, [], False

    async def receive() -> dict:
        nonlocal sent
        if sent:  # the "client" never hangs up: wait until the handler stops listening
            await asyncio.get_running_loop().create_future()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        nonlocal stream
        if message["type"] == "http.response.start":
            stream = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                         for k, v in message.get("headers", []))
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))
    await app(scope, receive, send)
    return b"".join(parts), stream


async def predict(server: Server, request: Request) -> Response:
    """POST AIP_PREDICT_ROUTE: {"instances": [...]} -> {"predictions": [...]}."""
    items = vertex.instances(await server.read_json(request))
    routes = vertex.PredictRoutes.from_routes(server.routes)

    async def one(instance) -> object:
        try:
            path, payload = routes.resolve(instance)
            reply, stream = await _call(server.app, request, path, payload)
            return vertex.prediction(reply, stream)
        except ApiError as exc:
            return exc.body()
    return JSONResponse(vertex.predictions_reply(list(await asyncio.gather(*map(one, items)))))
