"""Vertex AI's custom-container prediction protocol, as llama-server speaks it
(tools/server/server-http.cpp: gcp_params, path_to_gcp_format, parse_gcp_predict_response,
server_http_context::register_gcp_compat).

With `AIP_MODE=PREDICTION` in the environment the server listens on `AIP_HTTP_PORT` (default
8080, replacing --port) and adds `POST AIP_PREDICT_ROUTE` (default /predict) and, when
`AIP_HEALTH_ROUTE` is set, a GET alias of /health. A predict body is
`{"instances": [...]}` (at most 128); each instance names a route in `@requestFormat`, by
path ("/v1/chat/completions") or camelCase alias ("chatCompletions"), and is that route's JSON
body. The instances run concurrently, never streamed; the reply is always 200 with
`{"predictions": [...]}` in instance order, each the JSON the route answered, error bodies
included, or an error body of its own for an instance that names no route.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from edgeinfer.server.errors import bad_request

MAX_INSTANCES = 128  # register_gcp_compat's MAX_INSTANCES
FORMAT_KEY = "@requestFormat"


def _getenv(env: Mapping[str, str], name: str, default: str, leading_slash: bool = False) -> str:
    """gcp_params::getenv: unset or empty gives the default; routes get a leading slash."""
    value = env.get(name) or ""
    if not value:
        return default
    return value if not leading_slash or value.startswith("/") else "/" + value


def _stoi(text: str) -> int:
    """std::stoi: leading blanks, a sign and digits, the rest ignored; no digits raises."""
    match = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", text)
    if match is None or not -2**31 <= int(match.group(1)) < 2**31:
        raise ValueError(f"AIP_HTTP_PORT is not a port number: {text!r}")
    return int(match.group(1))


@dataclass(frozen=True)
class VertexSettings:
    """gcp_params, read from the environment once at startup."""

    enabled: bool  # AIP_MODE == "PREDICTION"
    health_route: str  # AIP_HEALTH_ROUTE; "" adds no route (/health is there anyway)
    predict_route: str  # AIP_PREDICT_ROUTE, default "/predict"
    port: int  # AIP_HTTP_PORT, default 8080

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> VertexSettings:
        env = os.environ if env is None else env
        return cls(enabled=_getenv(env, "AIP_MODE", "") == "PREDICTION",
                   health_route=_getenv(env, "AIP_HEALTH_ROUTE", "", True),
                   predict_route=_getenv(env, "AIP_PREDICT_ROUTE", "/predict", True),
                   port=_stoi(_getenv(env, "AIP_HTTP_PORT", "8080")))

    def listen_port(self, port: int) -> int:
        """server_http_context::init: AIP_HTTP_PORT replaces --port in prediction mode."""
        return self.port if self.enabled else port


def request_format(path: str) -> str:
    """path_to_gcp_format: a route's camelCase alias, "/v1" and the leading slash dropped,
    "/", "-" and "_" capitalising the next character, a ":param" cutting the rest
    ("/v1/chat/completions" -> "chatCompletions", "/apply-template" -> "applyTemplate")."""
    if len(path) > 3 and path.startswith("/v1"):
        path = path[3:]
    path = path.removeprefix("/")
    out, cap = [], False
    for c in path:
        if c == ":":
            break
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap and "a" <= c <= "z" else c)
            cap = False
    return "".join(out)


@dataclass(frozen=True)
class PredictRoutes:
    """What an instance may name: every route registered before the predict route."""

    handlers: dict[str, Any]  # path -> handler of its first registration, any method
    aliases: dict[str, str]  # request_format(path) -> path, the first path wins

    @classmethod
    def from_routes(cls, routes: Iterable[tuple[str, str, Any]]) -> PredictRoutes:
        """From (method, path, handler) in registration order. llama-server keys its handlers
        by path alone and keeps the first (GET /props, not POST /props); its alias map is
        filled from an unordered_map, so which of two paths with one alias wins ("/completions"
        or "/v1/completions") is unspecified there: here the one registered first."""
        handlers: dict[str, Any] = {}
        for _method, path, handler in routes:
            handlers.setdefault(path, handler)
        aliases: dict[str, str] = {}
        for path in handlers:
            aliases.setdefault(request_format(path), path)
        return cls(handlers, aliases)

    def check(self, settings: VertexSettings) -> None:
        """register_gcp_compat refuses to start when the predict route is taken."""
        if settings.enabled and settings.predict_route in self.handlers:
            raise ValueError(f"AIP_PREDICT_ROUTE={settings.predict_route} conflicts with an "
                             "existing llama-server route")

    def resolve(self, instance: Any) -> tuple[str, dict]:
        """An instance -> (the route's path, its JSON body): `@requestFormat` removed and a
        `stream` field forced to false. An instance naming no route raises ApiError 400, whose
        body() is then that instance's prediction."""
        if not isinstance(instance, dict):
            raise bad_request("each instance must be a JSON object")
        name = instance.get(FORMAT_KEY)
        if not isinstance(name, str):
            raise bad_request("each instance must include a string @requestFormat")
        payload = {k: v for k, v in instance.items() if k != FORMAT_KEY}
        if "stream" in payload:  # llama logs a warning: no streaming through predict
            payload["stream"] = False
        path = self.aliases.get(name) or (name if name in self.handlers else None)
        if path is None:
            raise bad_request(f"no handler registered for @requestFormat: {name}")
        return path, payload


def instances(body: Any) -> list:
    """The predict body's instances; a bad body is a plain 400 error reply."""
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    if not isinstance(body.get("instances"), list):
        raise bad_request("request body must include an array field named instances")
    if len(body["instances"]) > MAX_INSTANCES:
        raise bad_request(f"instances array exceeds maximum size of {MAX_INSTANCES}")
    return body["instances"]


def prediction(reply_body: bytes | str, stream: bool = False) -> Any:
    """parse_gcp_predict_response: a route's reply body (whatever its status) as JSON, the raw
    text when it is not JSON (/metrics), None when empty; a streamed reply raises ApiError
    400 (its body() is then the prediction)."""
    if stream:
        raise bad_request("predict route does not support streaming responses")
    text = reply_body.decode("utf-8", "replace") if isinstance(reply_body, bytes) \
        else reply_body
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def predictions_reply(predictions: list) -> dict:
    """The 200 reply, predictions in instance order."""
    return {"predictions": predictions}
