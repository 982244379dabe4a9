"""`edgeinfer run` through a running server, as `ollama run` talks to its own: no model load,
the answer streamed from the server's /completion with the same stdout/stderr contract.

The server is --host URL, else $EDGEINFER_HOST, else the default address when it answers
/health at once. One named explicitly must answer and serve the model asked for; the
default one is used only if it does, else the run loads the model itself (as --local).
Standard library only (urllib): `run` needs no HTTP client package.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from edgeinfer.decoder import Timings
from edgeinfer.errors import EdgeInferError

DEFAULT_URL = "http://127.0.0.1:8080"
PROBE_SECONDS = 0.3  # the default address answers at once, or there is no server there


def _url(value: str) -> str:
    value = value.strip().rstrip("/")
    return value if "://" in value else f"http://{value}"


def _get(url: str, timeout: float) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _served_names(base: str, timeout: float) -> set[str]:
    """The file names and aliases of the models a server (or a router) serves."""
    names = set()
    try:  # a single-model server; a router answers /props only for a named model
        props = _get(base + "/props", timeout)
        names |= {Path(str(props.get("model_path", ""))).name, str(props.get("model_alias", ""))}
    except (urllib.error.URLError, OSError, ValueError, AttributeError, TypeError):
        pass
    names |= {str(m.get("id")) for m in _get(base + "/v1/models", timeout).get("data", [])}
    return {n for n in names if n}


def _wanted_names(model: str) -> set[str]:
    from edgeinfer.pull import KNOWN_MODELS

    names = {model, Path(model).name, Path(model).stem}
    if model in KNOWN_MODELS:
        names.add(KNOWN_MODELS[model].filename)
    return names


def find_server(host: str | None, model: str | None) -> str | None:
    """The base URL of the server to use, or None to run in-process."""
    explicit = host or os.environ.get("EDGEINFER_HOST")
    base = _url(explicit or DEFAULT_URL)
    try:
        timeout = 30 if explicit else PROBE_SECONDS
        health = _get(base + "/health", timeout)
        ready = isinstance(health, dict) and health.get("status") == "ok"
        served = _served_names(base, 10 * timeout) if ready else set()
    except (urllib.error.URLError, OSError, ValueError, AttributeError, TypeError) as exc:
        # not an edgeinfer or llama-server answer (another service on the port)
        if explicit:
            reason = getattr(exc, "reason", exc)
            raise EdgeInferError(f"no edgeinfer server answers at {base} ({reason}); "
                                 f"use --local to run the model here") from None
        return None
    if not ready:
        if explicit:
            raise EdgeInferError(f"the server at {base} is not ready: {health}")
        return None
    if model is not None and not (_wanted_names(model) & served):
        if explicit:
            raise EdgeInferError(f"the server at {base} serves {', '.join(sorted(served))}, "
                                 f"not {model}; use --local to run it here")
        return None
    return base


def _post(base: str, path: str, body: dict):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(req, timeout=3600)
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {exc.code}"
        raise EdgeInferError(message) from None
    except (urllib.error.URLError, OSError) as exc:
        raise EdgeInferError(f"lost the server at {base}: {exc}") from None


def _model_field(opts) -> dict:
    """The request's `model`: a router picks its worker by it (the file name without .gguf,
    or a known model's); a single-model server ignores it."""
    if opts.model is None:
        return {}
    from edgeinfer.pull import KNOWN_MODELS

    spec = KNOWN_MODELS.get(opts.model)
    return {"model": Path(spec.filename if spec else opts.model).stem}


def remote_prompt(base: str, opts) -> str:
    """The prompt text: the server's chat template around it unless --raw."""
    if opts.raw:
        return opts.prompt
    from edgeinfer.commands.run import prompt_messages

    body = {"messages": prompt_messages(opts), **_model_field(opts)}
    with _post(base, "/apply-template", body) as r:
        return json.loads(r.read())["prompt"]


def run_remote(base: str, opts) -> None:
    """Stream the answer from the server at base: text to stdout, timings to stderr."""
    from edgeinfer.commands.run import print_timings

    s = opts.sampling
    body = {"prompt": remote_prompt(base, opts), "n_predict": opts.n_predict, "stream": True,
            "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
            "min_p": s.min_p, "repeat_penalty": s.repeat_penalty,
            "repeat_last_n": s.repeat_last_n, "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty, "stop": list(opts.stop),
            "seed": -1 if s.seed is None else s.seed, **_model_field(opts)}
    if opts.grammar is not None:
        body["grammar"] = opts.grammar
    if opts.json_schema is not None:
        try:
            body["json_schema"] = json.loads(opts.json_schema)
        except ValueError as exc:
            raise EdgeInferError(f"--json-schema is not valid JSON: {exc}") from None
    final = None
    with _post(base, "/completion", body) as stream:
        for raw in stream:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise EdgeInferError(event["error"].get("message", "the server failed"))
            if event.get("content"):
                sys.stdout.write(event["content"])
                sys.stdout.flush()
            if event.get("stop"):
                final = event
                break
    if sys.stdout.isatty():
        sys.stdout.write("\n")
    if not opts.quiet and final is not None and final.get("timings"):
        print_timings(Timings.from_dict(final["timings"]))
