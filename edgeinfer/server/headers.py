"""Response header names in llama-server's case (`Access-Control-Allow-Origin`,
`Process-Start-Time-Unix`). HTTP says names are case-insensitive, but clients that copy
headers into a plain dict (llama.cpp's own tests do) look them up by llama-server's spelling;
starlette lower-cases every name, so they are restored here, the last step before the
socket."""

from __future__ import annotations

from typing import Any

# names whose usual spelling is not the word-by-word capitalisation
SPELLED = {b"etag": b"ETag", b"www-authenticate": b"WWW-Authenticate"}


def header_case(name: bytes) -> bytes:
    """content-type -> Content-Type."""
    return SPELLED.get(name) or b"-".join(part[:1].upper() + part[1:]
                                          for part in name.split(b"-"))


class HeaderCaseMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_cased(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [(header_case(bytes(k).lower()), v)
                                                  for k, v in message.get("headers", [])]}
            await send(message)
        await self.app(scope, receive, send_cased)
