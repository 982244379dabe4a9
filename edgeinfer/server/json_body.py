"""Request bodies -> JSON values, within the limits a public server needs.

llama-server reads bodies with cpp-httplib (at most 100 MiB, else 413) and parses them with
nlohmann::json, which refuses what Python's `json` lets through: the literals `Infinity`,
`-Infinity` and `NaN`, numbers that overflow (`1e400`), escaped lone surrogates (`"\\udcff"`).
Those are refused here too, at parse time, so no handler ever sees a non-finite number or a
string that cannot be encoded back to UTF-8. `json.loads` recurses once per nesting level, so
the nesting is measured first, without recursion, and a body nested deeper than `MAX_DEPTH`
is refused before it is parsed. Every refusal is a 400 (413 for size) with a one-line message.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Any

import numpy as np
from starlette.requests import Request

from edgeinfer.server.errors import ApiError, bad_request

MAX_BODY_BYTES = 64 << 20  # default of --max-body-bytes (cpp-httplib's, in llama-server: 100 MiB)
MAX_DEPTH = 256  # nesting of arrays and objects (nlohmann::json has no limit)
PARSE_IN_THREAD = 1 << 20  # bodies larger than this are parsed off the event loop

_STRUCTURE = b'[]{}"'
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in _STRUCTURE)
_STEP = np.zeros(256, dtype=np.int8)  # nesting step per byte: +1 opens, -1 closes
_STEP[[ord("["), ord("{")]], _STEP[[ord("]"), ord("}")]] = 1, -1
_CHUNK = 1 << 20
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_INT_RANGE = (-(1 << 63), (1 << 64) - 1)  # what nlohmann::json holds as an integer


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is larger than the server's limit of {limit} bytes")


async def read_json_body(request: Request, limit: int = MAX_BODY_BYTES) -> Any:
    """The body of `request` parsed as JSON; 413 past `limit` bytes (read no further)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if len(raw) > PARSE_IN_THREAD:
        return await asyncio.to_thread(parse_json_body, raw)
    return parse_json_body(raw)


def parse_json_body(raw: bytes) -> Any:
    """Strict JSON (see the module docstring); an empty body is `null`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"Invalid JSON in request body: not valid UTF-8 at byte {exc.start}")
    if nested_deeper_than(raw, MAX_DEPTH):
        raise bad_request(f"Invalid JSON in request body: nested deeper than {MAX_DEPTH} levels")
    try:
        value = json.loads(text or "null", parse_constant=_refuse_constant,
                           parse_float=_finite_float, parse_int=_bounded_int)
    except ValueError as exc:  # json.JSONDecodeError and the hooks' refusals
        raise bad_request(f"Invalid JSON in request body: {exc}") from None
    if _SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogates(value)
    return value


def nested_deeper_than(raw: bytes, limit: int) -> bool:
    """Whether JSON `raw` (UTF-8) nests arrays and objects more than `limit` deep; brackets
    inside strings do not count. Bulk byte and array operations only: no recursion, and no
    Python loop per byte or per string."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    # Escaped backslashes, then escaped quotes, go first (left to right, as JSON pairs them):
    # every quote left then opens or closes a string.
    flat = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    codes = np.frombuffer(flat, dtype=np.uint8)
    level, in_string = 0, 0
    for start in range(0, len(codes), _CHUNK):
        chunk = codes[start:start + _CHUNK]
        quotes = chunk == ord('"')
        parity = (np.cumsum(quotes, dtype=np.int64) + in_string) % 2
        steps = np.where(parity == 1, 0, _STEP[chunk])  # a closing quote's own step is 0
        running = np.cumsum(steps, dtype=np.int64) + level
        if running.max() > limit:
            return True
        level, in_string = int(running[-1]), int(parity[-1])
    return False


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    value = int(text) if len(text) <= 21 else None
    if value is None or not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
        raise ValueError(f"integer {text[:40]} is out of range")
    return value


def _refuse_lone_surrogates(value: Any) -> None:
    """400 if any string (or object key) holds half a surrogate pair: JSON can escape one,
    but it is no text (nlohmann::json refuses it as invalid JSON)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise bad_request(f"Invalid JSON in request body: a string is not valid UTF-8 "
                                  f"(a lone surrogate \\u{ord(item[exc.start]):04x})") from None
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
