"""The chat page at `/` (llama-server has a web UI; this is ours): static files shipped in
edgeinfer/server/ui/, no build step and nothing loaded from the network. The page talks to the
same API any client uses (`/v1/models`, `/v1/chat/completions` streamed); stopping a reply
aborts its request, and the server cancels a sequence whose client went away.

Both the single-model server and the router add these routes (`add_ui_routes`); neither needs
an API key, so the page can load and then ask for one. `--no-ui` leaves them out.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from edgeinfer.server.errors import NOT_FOUND

UI_DIR = Path(__file__).parents[1] / "ui"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
ASSETS = ("app.js", "markdown.js", "style.css", "icon.svg")  # served under /ui/
# Defence in depth for the page: its own scripts, styles and API only. The renderer never
# writes model text as HTML (markdown.js), so this is a second wall, not the first.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff",
           "referrer-policy": "no-referrer", "cache-control": "no-cache"}


def _file_response(name: str) -> Response:
    path = UI_DIR / name
    return Response(path.read_bytes(), media_type=TYPES[path.suffix], headers=HEADERS)


async def page() -> Response:
    return _file_response("index.html")


async def asset(name: str) -> Response:
    if name not in ASSETS:
        return JSONResponse(NOT_FOUND.body(), status_code=404)
    return _file_response(name)


def add_ui_routes(app: FastAPI) -> None:
    """GET (and HEAD) `/` and `/ui/{name}`; add them before any catch-all route."""
    app.add_api_route("/", page, methods=["GET", "HEAD"], include_in_schema=False)
    app.add_api_route("/ui/{name}", asset, methods=["GET", "HEAD"], include_in_schema=False)
