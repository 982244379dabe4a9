"""The chat routes: OpenAI chat completions, the Anthropic Messages API and the OpenAI
Responses API share one path, as in llama-server. A request is converted to an OpenAI chat
body (apis/), validated (params.parse_chat), rendered with the chat template into prompt
tokens (`prepare`), run, and the generated text of each choice is parsed back into a message
(content, reasoning, tool calls: `Choice`), whose diffs each API renders in its own shapes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edgeinfer.chat import ChatParseError, ChatParser, MsgDiff
from edgeinfer.chat.grammar import LazyStart
from edgeinfer.server import responses as fmt
from edgeinfer.server.apis import ChatMeta, ChatOutcome
from edgeinfer.server.apis import anthropic as anthropic_api
from edgeinfer.server.apis import oai_responses as responses_api
from edgeinfer.server.apis.oai_chat import OaiChatReply
from edgeinfer.server.engine import FinalEvent, ProgressEvent, TokenEvent
from edgeinfer.server.errors import ApiError, bad_request
from edgeinfer.server.params import ChatRequest, GenParams, check_chat_fields, parse_chat
from edgeinfer.server.routes.completions import verbose_field
from edgeinfer.server.runs import (
    Run,
    check_prompt,
    collect,
    each_completion,
    frames,
    start_run,
    stream,
)
from edgeinfer.server.state import Server
from edgeinfer.structured.compile import Constraint


# -- the prompt ------------------------------------------------------------------------------
@dataclass
class ChatPrompt:
    req: ChatRequest | None  # the generation fields (None: the prompt alone was asked for)
    text: str
    ids: list[int]
    new_parser: Callable[[], ChatParser]  # a parser of one choice's generated text


def _template_prompt(server: Server, body: dict):
    check_chat_fields(body)
    return server.engine.chat.prompt(body)


async def prepare(server: Server, body: dict, generate: bool = True) -> ChatPrompt:
    """An OpenAI chat body -> its generation fields, the prompt (rendered by the chat layer,
    llama.cpp's way) and its tokens, and how to parse what is generated."""
    req = parse_chat(body, vocab=server.vocab, defaults=server.defaults) if generate else None
    result = await asyncio.to_thread(_template_prompt, server, body)
    if req is not None:
        req = replace(req, params=_with_template(server, req.params, result))
    ids = await asyncio.to_thread(server.model.tokenize, result.prompt, True, True)
    echo = body.get("echo") is True
    return ChatPrompt(req, result.prompt, ids, lambda: ChatParser(result.syntax, echo=echo))


def _with_template(server: Server, params: GenParams, result) -> GenParams:
    """What the rendered prompt adds to the request: its stop strings, and the tool-call
    grammar (lazy from the format's call marker under tool_choice auto, else fed the
    generation prompt first) with the special tokens its markers are."""
    params = replace(params, stop=params.stop + tuple(result.additional_stops))
    if not result.grammar:
        return params
    if params.constraint is not None:
        raise bad_request("Cannot use custom grammar constraints with tools.")
    lazy = None
    if result.grammar_lazy:
        lazy = LazyStart(tuple(t.value for t in result.grammar_triggers),
                         result.thinking_start_tag, tuple(result.thinking_end_tags),
                         result.syntax.starts_in_reasoning)
    return replace(params, constraint=Constraint("lark", result.grammar), lazy=lazy,
                   prefill=result.grammar_prefill,
                   preserved=_token_ids(server, result.preserved_tokens))


def _token_ids(server: Server, texts: tuple[str, ...]) -> frozenset[int]:
    """The ids of the texts that are one token each (preserved tokens)."""
    tok, ids = server.model.tokenizer, set()
    for text in texts:
        encoded = tok.encode(text, add_special=False, parse_special=True)
        if len(encoded) == 1:
            ids.add(encoded[0])
    return frozenset(ids)


class Choice:
    """One choice's message as its text arrives, and the diffs each piece makes."""

    def __init__(self, parser: ChatParser) -> None:
        self.parser = parser

    def feed(self, text: str) -> list[MsgDiff]:
        return self._parse(self.parser.feed, text) if text else []

    def finish(self, final: FinalEvent) -> tuple[list[MsgDiff], ChatOutcome]:
        diffs = self._parse(self.parser.finish, final.text)
        reason = "length" if final.stop_type == "limit" else "stop"
        return diffs, ChatOutcome(self.parser.message, reason, final.n_prompt, final.n_cached,
                                  final.n_decoded, final.timings, final.stopping_word)

    @staticmethod
    def _parse(step: Callable[[str], list[MsgDiff]], text: str) -> list[MsgDiff]:
        try:
            return step(text)
        except ChatParseError as exc:  # the output left the template's format
            raise ApiError(500, f"could not parse the generated text: {exc}") from None


def _meta(server: Server, id_: str | None = None) -> ChatMeta:
    return ChatMeta(server.model_id, id_ or fmt.completion_id(), int(time.time()))


async def _outcomes(request: Request, run: Run,
                    prompt: ChatPrompt) -> tuple[list[ChatOutcome], list[fmt.Result]]:
    """A non-stream reply: every choice's whole text, parsed once."""
    results = await collect(request, run)
    outcomes = []
    for result in results:
        whole = replace(result.final, text=result.content)  # parsed once, as a whole
        outcomes.append(Choice(prompt.new_parser()).finish(whole)[1])
    return outcomes, results


# -- OpenAI chat completions -------------------------------------------------------------------
async def chat(server: Server, request: Request) -> Response:
    """POST /v1/chat/completions."""
    prompt = await prepare(server, await server.read_json(request))
    check_prompt(server, prompt.ids)
    params = prompt.req.params
    reply = OaiChatReply(_meta(server), fmt.BUILD_INFO, params.include_usage)
    run = await start_run(server, each_completion(server, [prompt.ids], params), params)
    if params.stream:
        choices = [Choice(prompt.new_parser()) for _ in run.jobs]

        def render(index: int, event: Any) -> list[dict]:
            choice = choices[index]
            if isinstance(event, ProgressEvent):
                return reply.partial(index, [], False, progress=fmt.progress_json(event))
            if isinstance(event, TokenEvent):
                probs = fmt.probs_json([event.probs], server.piece) if event.probs else None
                return reply.partial(index, choice.feed(event.text), event.n_decoded == 1,
                                     probs, event.timings)
            diffs, outcome = choice.finish(event)
            return reply.final(index, diffs, outcome, first=event.n_decoded == 0)
        return stream(run, render, True, server.ping_interval(params))
    outcomes, results = await _outcomes(request, run, prompt)
    logprobs = [fmt.probs_json(r.probs, server.piece) for r in results] \
        if prompt.req.logprobs else None
    body = reply.reply(outcomes, logprobs)
    if params.verbose:
        body.update(verbose_field(server, params, prompt.ids, results[0]))
    return JSONResponse(body)


async def chat_input_tokens(server: Server, request: Request) -> Response:
    """POST /v1/chat/completions/input_tokens: the prompt's length in tokens, without
    running it (llama-server's handle_count_tokens)."""
    prompt = await prepare(server, await server.read_json(request), generate=False)
    return JSONResponse({"input_tokens": len(prompt.ids), "object": "response.input_tokens"})


async def apply_template(server: Server, request: Request) -> Response:
    """POST /apply-template: the prompt a chat request would run, as text."""
    body = await server.read_json(request)
    result = await asyncio.to_thread(_template_prompt, server, body)
    return JSONResponse({"prompt": result.prompt})


# -- one-choice APIs: Anthropic Messages, OpenAI Responses -----------------------------------
async def _single(server: Server, request: Request, prompt: ChatPrompt, reply: Any,
                  render: Callable[[Choice, Any], list[str]]) -> Response:
    """Run one choice: streamed as `render(choice, event)` gives each event's frames, or
    answered whole with `reply.reply`."""
    check_prompt(server, prompt.ids)
    params = prompt.req.params
    run = await start_run(server, [prompt.ids], params)
    if params.stream:
        choice = Choice(prompt.new_parser())
        return frames(run, lambda index, event: "".join(render(choice, event)),
                      lambda err: "".join(reply.error(err)), "", server.ping_interval(params))
    outcomes, _ = await _outcomes(request, run, prompt)
    return JSONResponse(reply.reply(outcomes[0]))


async def messages(server: Server, request: Request) -> Response:
    """POST /v1/messages: message_start comes with the first token, once the prompt's
    cache use is known (llama-server sends it with the first partial result)."""
    body = await server.read_json(request)
    prompt = await prepare(server, anthropic_api.to_chat_body(body))
    reply = anthropic_api.AnthropicReply(_meta(server), body)

    def render(choice: Choice, event: Any) -> list[str]:
        if isinstance(event, ProgressEvent):
            return []
        if isinstance(event, TokenEvent):
            head = reply.start(len(prompt.ids), event.n_cached) if event.n_decoded == 1 else []
            return head + reply.update(choice.feed(event.text))
        _, outcome = choice.finish(event)
        head = reply.start(outcome.n_prompt, outcome.n_cached) if event.n_decoded == 0 else []
        return head + reply.end(outcome)
    return await _single(server, request, prompt, reply, render)


async def count_tokens(server: Server, request: Request) -> Response:
    """POST /v1/messages/count_tokens."""
    body = anthropic_api.to_chat_body(await server.read_json(request))
    prompt = await prepare(server, body, generate=False)
    return JSONResponse(anthropic_api.count_tokens_reply(len(prompt.ids)))


async def responses(server: Server, request: Request) -> Response:
    """POST /v1/responses."""
    body = await server.read_json(request)
    prompt = await prepare(server, responses_api.to_chat_body(body))
    reply = responses_api.ResponsesReply(_meta(server, responses_api.response_id()), body)

    def render(choice: Choice, event: Any) -> list[str]:
        if isinstance(event, ProgressEvent):
            return reply.progress(fmt.progress_json(event), event.timings)
        if isinstance(event, TokenEvent):
            return reply.update(choice.feed(event.text), event.timings)
        return reply.end(choice.finish(event)[1])
    return await _single(server, request, prompt, reply, render)


async def responses_input_tokens(server: Server, request: Request) -> Response:
    """POST /v1/responses/input_tokens."""
    body = responses_api.to_chat_body(await server.read_json(request))
    prompt = await prepare(server, body, generate=False)
    return JSONResponse({"input_tokens": len(prompt.ids), "object": "response.input_tokens"})
