"""Safe defaults for a server on a laptop: which Host and Origin a request may carry, CORS
headers, the API key check, and model paths kept out of replies.

A web page the user visits can send requests to 127.0.0.1 from the user's own browser. Two
guards stop it from driving the server, both answered before any route runs:

- **Host (DNS rebinding).** A page on `evil.example` can re-point that name at 127.0.0.1; the
  browser then sends `Host: evil.example` to this server and treats the replies as
  same-origin. A Host is accepted when it is an IP literal (a rebinding page never has an IP
  address for its origin: that address would be this server), `localhost` or a name under
  `.localhost`, the machine's host name, the name the server was bound to, or one listed with
  `--allowed-hosts` (`*` turns the check off, for a server behind a reverse proxy). The rule is
  the same when bound to 0.0.0.0: clients on the network reach it by address, or by a name
  given with `--allowed-hosts`. (Ollama checks the Host only when bound to loopback, and
  accepts any `.local` or `.internal` name; llama-server does not check it.)
- **Origin (CORS).** A request whose `Origin` is not allowed is refused with 403 (as Ollama
  does), so a page can neither read replies nor start generations blind. `--cors-origins`
  takes llama-server's values, comma-separated: exact origins (`https://app.example`), `*`
  (any origin, answered `Access-Control-Allow-Origin: *`), `localhost` (origins whose host is
  localhost, 127.0.0.1 or ::1, any port; the default). `Access-Control-Allow-Credentials` is
  never sent: keys travel in headers, which need no credentials mode. A same-origin request
  (its Origin is `http(s)://` + its Host) is always let through: it comes from a page this
  server served, the chat page at `/` reached by a network address for one; not with
  `--allowed-hosts *`, where the Host proves nothing.

The API key is read as llama-server reads it, `Authorization` first and `X-Api-Key` only when
that header is absent, but `Authorization` must use the Bearer scheme (llama-server also takes
a bare key there). Keys are compared in constant time.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from edgeinfer.errors import EdgeInferError
from edgeinfer.server.errors import ApiError

log = logging.getLogger("edgeinfer.server")
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})  # llama-server's "localhost" origins
PREFLIGHT_MAX_AGE = "600"
MAX_ECHO = 200  # characters of a refused Host or Origin quoted in the error message


def split_list(value: str | None) -> tuple[str, ...]:
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_name(host: str) -> str:
    """The name part of a Host header value: no port, no brackets, lower case, no final dot."""
    host = host.strip().lower()
    if host.startswith("["):  # [v6]:port
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _origin_host(origin: str) -> str | None:
    try:
        return urlsplit(origin).hostname
    except ValueError:
        return None


def _quote(text: str) -> str:
    text = text if len(text) <= MAX_ECHO else text[:MAX_ECHO] + "..."
    return json.dumps(text)


@dataclass(frozen=True)
class AccessPolicy:
    """The Host and Origin rules, from `--allowed-hosts`, `--cors-origins` and `--host`."""

    cors_origins: str = "localhost"
    allowed_hosts: str = ""
    bound_host: str = "127.0.0.1"
    hosts: frozenset[str] = field(init=False)
    origins: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        names = {host_name(h) for h in split_list(self.allowed_hosts)}
        names |= {host_name(self.bound_host), socket.gethostname().lower()}
        object.__setattr__(self, "hosts", frozenset(names))
        origins = {o.lower().rstrip("/") for o in split_list(self.cors_origins)}
        object.__setattr__(self, "origins", frozenset(origins))

    def host_allowed(self, host: str | None) -> bool:
        if host is None or "*" in self.hosts:  # HTTP/1.0 without Host: not a browser
            return True
        name = host_name(host)
        return (_is_ip(name) or name == "localhost" or name.endswith(".localhost")
                or name in self.hosts)

    def origin_allowed(self, origin: str) -> bool:
        if "*" in self.origins or origin.lower().rstrip("/") in self.origins:
            return True
        return "localhost" in self.origins and _origin_host(origin) in LOCAL_NAMES

    def same_origin(self, origin: str, host: str | None) -> bool:
        """Whether a request comes from a page of this server (Origin matches the Host that
        passed the DNS rebinding guard)."""
        if host is None or "*" in self.hosts:
            return False
        try:
            parts = urlsplit(origin)
        except ValueError:
            return False
        return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()

    def allow_origin_value(self, origin: str) -> str:
        """Access-Control-Allow-Origin for an allowed origin."""
        return "*" if "*" in self.origins else origin


async def send_error(send, error: ApiError, extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """Answer an HTTP request with the error envelope, outside the routes."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json; charset=utf-8"),
               (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class AccessMiddleware:
    """ASGI middleware: refuses a bad Host or Origin with 403, answers CORS preflights for
    allowed origins (before the API key check: browsers send no key in a preflight), and adds
    CORS headers to the replies to allowed origins."""

    def __init__(self, app, policy: AccessPolicy):
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        host, origin = headers.get("host"), headers.get("origin")
        if not self.policy.host_allowed(host):
            log.warning("refused a request for Host %s", _quote(host or ""))
            return await send_error(send, ApiError(
                403, f"Host {_quote(host or '')} is not allowed (DNS rebinding guard); start "
                     "the server with --allowed-hosts NAME to allow a name"))
        if origin is None or self.policy.same_origin(origin, host):
            return await self.app(scope, receive, send)
        if not self.policy.origin_allowed(origin):
            log.warning("refused a request from Origin %s", _quote(origin))
            return await send_error(send, ApiError(
                403, f"Origin {_quote(origin)} is not allowed; start the server with "
                     "--cors-origins ORIGIN to allow it"))
        cors = [(b"access-control-allow-origin", self.policy.allow_origin_value(origin).encode()),
                (b"vary", b"Origin")]
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            return await self._preflight(send, headers, cors)

        async def send_with_cors(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)
        await self.app(scope, receive, send_with_cors)

    async def _preflight(self, send, headers: Mapping[str, str], cors: list) -> None:
        cors = [*cors, (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
                (b"access-control-allow-headers",
                 headers.get("access-control-request-headers", "*").encode("latin-1")),
                (b"access-control-max-age", PREFLIGHT_MAX_AGE.encode()),
                (b"content-length", b"0")]
        if headers.get("access-control-request-private-network") == "true":
            cors.append((b"access-control-allow-private-network", b"true"))
        await send({"type": "http.response.start", "status": 200, "headers": cors})
        await send({"type": "http.response.body", "body": b""})


def _headers(scope) -> dict[str, str]:
    """Request headers by lower-case name (the first of repeated ones)."""
    headers: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return headers


# -- API key -------------------------------------------------------------------------------
def request_key(headers: Mapping[str, str]) -> str | None:
    """The key a request presents: `Authorization: Bearer KEY`, else (no Authorization
    header at all) `X-Api-Key: KEY`; None for any other form."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, key = auth.partition(" ")
        return key if scheme == "Bearer" and key else None
    return headers.get("x-api-key") or None


def key_matches(keys: Iterable[str], presented: str | None) -> bool:
    """Whether `presented` is one of `keys`, in time independent of where they differ (and,
    comparing digests, of their lengths); every key is compared."""
    if presented is None:
        return False
    digest = hashlib.sha256(presented.encode("utf-8", "surrogatepass")).digest()
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(digest, hashlib.sha256(key.encode()).digest())
    return matched


# -- model paths -----------------------------------------------------------------------------
def path_redactor(model_path: Path) -> Callable[[str], str]:
    """A function replacing the model's path and folders in a message by the file name."""
    forms = {str(model_path), str(model_path.absolute())}
    try:
        forms.add(str(model_path.resolve()))
    except OSError:
        pass
    # folders too (a message may name a sibling file), unless too short to be told from text
    folders = {str(Path(f).parent) for f in forms if len(str(Path(f).parent)) >= 5}
    ordered = sorted(forms, key=len, reverse=True) + sorted(folders, key=len, reverse=True)

    def redact(text: str) -> str:
        for form in ordered:
            text = text.replace(form, model_path.name if form in forms else "<models>")
        return text
    return redact


def public_error(exc: Exception, redact: Callable[[str], str]) -> Exception:
    """`exc` as it may be shown to a client: its message without the model's path."""
    message = str(exc)
    clean = redact(message)
    if clean == message:
        return exc
    if isinstance(exc, ApiError):
        return ApiError(exc.status, redact(exc.message), exc.type, **exc.extra)
    if isinstance(exc, EdgeInferError):  # keep the class: it may choose the status
        public = copy.copy(exc)
        public.args = (clean,)
        return public if str(public) == clean else EdgeInferError(clean)
    log.error("request failed", exc_info=exc)  # in full here; the client gets it redacted
    return ApiError(500, f"{type(exc).__name__}: {clean}")
