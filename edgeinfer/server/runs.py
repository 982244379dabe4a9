"""Running a request's jobs on the engine and delivering their events: the prompt checks
shared by the generation routes, `Run` (the jobs of one request and their event queue),
`collect` for a whole reply and `stream` for SSE. A client that hangs up cancels its jobs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect

from edgeinfer.server import responses as fmt
from edgeinfer.server.apis import sse_frame
from edgeinfer.server.engine import ErrorEvent, FinalEvent, Job, TokenEvent
from edgeinfer.server.errors import ApiError, bad_request, context_exceeded
from edgeinfer.server.params import GenParams, PromptPiece

if TYPE_CHECKING:
    from edgeinfer.server.state import Server

log = logging.getLogger("edgeinfer.server")
SSE_HEADERS = {"X-Accel-Buffering": "no", "Cache-Control": "no-cache"}


class ClientGone(Exception):
    """The client hung up while its (non-stream) reply was being generated."""

    def __init__(self, n_tokens: int):
        super().__init__(f"client disconnected after {n_tokens} tokens")
        self.n_tokens = n_tokens



# -- prompts -------------------------------------------------------------------------------
def encode_prompt(server: Server, pieces: list[PromptPiece]) -> list[int]:
    """Text pieces are tokenized (specials parsed; BOS only when the prompt starts with
    text and the model adds BOS), ids are kept as given (llama-server)."""
    tok, ids = server.model.tokenizer, []
    for i, piece in enumerate(pieces):
        if isinstance(piece, str):
            ids += tok.encode(piece, add_special=i == 0, parse_special=True)
        elif 0 <= piece < tok.n_vocab:
            ids.append(piece)
        else:
            raise bad_request(f"token id {piece} is outside the vocabulary ({tok.n_vocab})")
    return ids


async def encode_prompts(server: Server, prompts: list[list[PromptPiece]]) -> list[list[int]]:
    """Tokenizing a long prompt takes milliseconds per thousand tokens of Python: it runs in
    a worker thread, so the event loop keeps streaming the other requests meanwhile."""
    return await asyncio.to_thread(lambda: [encode_prompt(server, p) for p in prompts])


def each_completion(server: Server, prompts: list[Any], params: GenParams) -> list[Any]:
    """Each prompt n_cmpl times, in llama-server's order (a prompt's completions together);
    n_cmpl is at most the number of slots, as there."""
    n_slots = server.engine.n_slots
    if not 1 <= params.n_cmpl <= n_slots:
        raise bad_request(f"Field 'n_cmpl': Value must be between 1 <= value <= {n_slots}, "
                          f"but got {params.n_cmpl}")
    return [p for p in prompts for _ in range(params.n_cmpl)]


def check_prompt(server: Server, ids: list[int]) -> None:
    if not ids:
        raise bad_request("the prompt is empty")
    if len(ids) >= server.engine.n_ctx:
        raise context_exceeded(len(ids), server.engine.n_ctx)


# -- running jobs --------------------------------------------------------------------------
class Mailbox:
    """Hands engine events to the event loop, waking it once per batch of events rather
    than once per event (one engine step emits an event for every running sequence)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.items, self.lock = loop, [], threading.Lock()

    def post(self, put: Callable[[Any], None], item: Any) -> None:
        with self.lock:
            self.items.append((put, item))
            wake = len(self.items) == 1
        if wake:
            self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self.lock:
            items, self.items = self.items, []
        for put, item in items:
            put(item)


class Run:
    """Jobs of one request and the asyncio queue their events arrive on."""

    def __init__(self, server: Server, prompts: list[list[int]], params: GenParams,
                 constraint: Any = None):
        if params.id_slot >= server.engine.n_slots:
            raise bad_request(f"id_slot {params.id_slot} does not exist "
                              f"({server.engine.n_slots} slots)")
        self.engine, self.queue = server.engine, asyncio.Queue()
        self.jobs = [Job(ids, params, self._sink(server.mailbox, i), constraint)
                     for i, ids in enumerate(prompts)]
        self.open = set(range(len(self.jobs)))
        self.n_tokens = 0  # token events delivered so far, all jobs together
        self.finished = False  # the whole reply was sent
        self.client_gone = False  # the client hung up (non-stream: seen by the watcher)
        self._getter: asyncio.Future | None = None
        for job in self.jobs:
            self.engine.submit(job)

    def _sink(self, mailbox: Mailbox, index: int):
        put = self.queue.put_nowait
        return lambda event: mailbox.post(put, (index, event))

    async def next(self, timeout: float | None = None) -> tuple[int, Any] | None:
        """The next (job index, event), or None after `timeout` seconds without one. The
        pending get survives a timeout, so no event is lost to it."""
        if self._getter is None:
            self._getter = asyncio.ensure_future(self.queue.get())
        done, _ = await asyncio.wait({self._getter}, timeout=timeout)
        if not done:
            return None
        getter, self._getter = self._getter, None
        if getter.cancelled():  # cancel() ran meanwhile: the client went away
            self.client_gone = True
            raise ClientGone(self.n_tokens)
        index, event = getter.result()
        if isinstance(event, (FinalEvent, ErrorEvent)):
            self.open.discard(index)
        elif isinstance(event, TokenEvent):
            self.n_tokens += 1
        return index, event

    def cancel(self) -> None:
        for index in self.open:
            self.engine.cancel(self.jobs[index])
        self.open.clear()
        if self._getter is not None:
            self._getter.cancel()


async def start_run(server: Server, prompts: list[list[int]], params: GenParams) -> Run:
    """Compile the request's constraint (in a worker thread: a schema can take a while)
    and submit its jobs. A constraint that does not compile is a 400 saying why; a schema
    llguidance enforces only in part is refused with `strict`, else logged."""
    compiled = None
    if params.constraint is not None:
        from edgeinfer.structured import compile_constraint

        compiled = await asyncio.to_thread(compile_constraint, server.model.tokenizer,
                                           params.constraint, not params.strict)
        if not compiled.exact:
            log.warning("json schema enforced in part; ignored: %s",
                        "; ".join(compiled.warnings))
    return Run(server, prompts, params, compiled)


async def _watch_disconnect(request: Request, run: Run) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    run.client_gone = True
    run.cancel()


async def collect(request: Request, run: Run) -> list[fmt.Result]:
    """Wait for every job to finish (non-stream); a disconnect cancels them."""
    results = [fmt.Result(len(job.prompt)) for job in run.jobs]
    watcher = asyncio.create_task(_watch_disconnect(request, run))
    try:
        while run.open:
            index, event = await run.next()
            if isinstance(event, ErrorEvent):
                raise event.error
            results[index].add(event)
    finally:
        watcher.cancel()
        run.cancel()
    if run.client_gone:
        raise ClientGone(run.n_tokens)
    run.finished = True
    return results


Chunker = Callable[[int, Any], list[dict]]


class EventStream(StreamingResponse):
    """The SSE reply of a Run. A client that hangs up cancels the Run's jobs and costs one
    log line: starlette cancels the body when it hears `http.disconnect` (ASGI < 2.4, as
    uvicorn speaks), or the send fails with OSError / ClientDisconnect (ASGI >= 2.4)."""

    def __init__(self, run: Run, body: AsyncIterator[str]):
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self.run = run
        self._release: Callable[[], None] | None = None

    def hold(self, engine: Any) -> None:
        """Keep the model loaded until the stream ends (engine.hold/release)."""
        engine.hold()
        self._release = engine.release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (OSError, ClientDisconnect):
            pass
        finally:
            self.run.cancel()
            if self._release is not None:
                self._release()
        if not self.run.finished:
            log.info("client disconnected: %s %s after %d tokens", scope["method"],
                     scope["path"], self.run.n_tokens)


def stream(run: Run, chunks: Chunker, done_marker: bool, ping: float) -> EventStream:
    """SSE: each event's chunks as `data:` lines, `:` pings while nothing comes, `[DONE]`
    on the /v1 routes. Closing the connection cancels the remaining jobs."""
    return frames(run, lambda index, event: "".join(sse_frame(c) for c in chunks(index, event)),
                  sse_frame, sse_frame("[DONE]") if done_marker else "", ping)


def frames(run: Run, render: Callable[[int, Any], str], render_error: Callable[[dict], str],
           tail: str, ping: float) -> EventStream:
    """SSE in any API's framing: `render` gives the text of each event, `render_error` that
    of an error body, `tail` is sent after the last event; `:` pings while nothing comes."""
    timeout = ping if ping > 0 else None

    async def body() -> AsyncIterator[str]:
        try:
            while run.open:
                item = await run.next(timeout)
                if item is None:
                    yield ":\n\n"  # keep-alive comment, ignored by SSE parsers
                    continue
                index, event = item
                try:
                    if isinstance(event, ErrorEvent):
                        raise event.error
                    text = render(index, event)
                except ApiError as exc:  # the engine's, or e.g. unparsable chat output
                    yield render_error(exc.body())
                    break
                if text:
                    yield text
            else:
                if tail:
                    yield tail
            run.finished = True
        finally:
            run.cancel()

    return EventStream(run, body())


