"""What every handler shares: the engine, the model's snapshot and the server's settings."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from fastapi import Request

from edgeinfer.server.apis.vertex import VertexSettings
from edgeinfer.server.engine import Engine
from edgeinfer.server.errors import LOADING, bad_request
from edgeinfer.server.json_body import read_json_body
from edgeinfer.server.metrics import Scraper
from edgeinfer.server.model_info import ModelInfo
from edgeinfer.server.options import ServerSettings
from edgeinfer.server.params import GenParams, Vocab
from edgeinfer.server.runs import Mailbox
from edgeinfer.server.security import AccessPolicy, path_redactor
from edgeinfer.server.shutdown import Gate


@dataclass
class Server:
    engine: Engine
    model_path: Path
    settings: ServerSettings = field(default_factory=ServerSettings)
    access: AccessPolicy = field(default_factory=AccessPolicy)
    gate: Gate = field(default_factory=Gate)
    start_time: float = field(default_factory=time.time)
    vertex: VertexSettings = field(default_factory=lambda: VertexSettings(False, "", "", 0))
    app: Any = None  # the ASGI app serving these routes (create_app sets it)
    routes: tuple = ()  # (method, path, handler) as registered, Vertex's predict excluded

    @property
    def model(self):
        """The loaded model: only inside `awake()` (it is None while the engine sleeps)."""
        return self.engine.model

    @property
    def info(self) -> ModelInfo:
        return self.engine.info

    @property
    def model_id(self) -> str:
        """The first alias in sorted order (llama-server keeps them in a std::set), else the
        file name: the model's path is never shown."""
        aliases = self.settings.aliases
        return min(aliases) if aliases else self.model_path.name

    @property
    def api_keys(self) -> tuple[str, ...]:
        return self.settings.api_keys

    @cached_property
    def defaults(self) -> GenParams:
        """A request's settings where it leaves them out: the server's sampling flags,
        -n and --verbose (llama-server's params_base)."""
        s = self.settings
        return GenParams(sampling=s.sampling, n_predict=s.n_predict, verbose=s.verbose)

    @cached_property
    def redact(self) -> Callable[[str], str]:
        return path_redactor(self.model_path)

    @cached_property
    def scraper(self) -> Scraper:
        return Scraper(self.engine, self.start_time)

    @cached_property
    def mailbox(self) -> Mailbox:
        """Created on first use, inside the server's event loop."""
        return Mailbox(asyncio.get_running_loop())

    @property
    def vocab(self) -> Vocab:
        """What request parsing needs of the model: logit_bias strings are tokenized as
        llama-server's common_tokenize(vocab, text, false) does (no BOS, no specials)."""
        tok = self.model.tokenizer
        return Vocab(tok.n_vocab, tuple(sorted(tok.eog_ids)),
                     lambda text: tok.encode(text, add_special=False, parse_special=False))

    async def read_json(self, request: Request) -> dict:
        body = await read_json_body(request, self.settings.max_body_bytes)
        if not isinstance(body, dict):
            raise bad_request("request body must be a JSON object")
        return body

    def piece(self, token: int) -> bytes:
        return self.model.tokenizer.token_to_piece(token, special=True)

    def ping_interval(self, params: GenParams) -> float:
        """The request's sse_ping_interval, else the server's; <= 0: no pings."""
        value = params.sse_ping_interval
        return self.settings.sse_ping_interval if value is None else value

    @asynccontextmanager
    async def awake(self):
        """Hold the model loaded while a handler uses it, loading it again first if the
        engine sleeps (--sleep-idle-seconds); 503 if that fails."""
        engine = self.engine
        try:
            if engine.hold():
                while not await asyncio.to_thread(engine.awake.wait, 1.0):
                    pass
                if engine.wake_error is not None:
                    raise engine.wake_error
            if engine.model is None:
                raise LOADING
            yield
        finally:
            engine.release()
