"""OpenAI's Responses API as llama-server serves it: `/v1/responses`, `/responses` and
`/v1/responses/input_tokens` (tools/server/server-chat.cpp, server-task.cpp,
server-context.cpp).

A request is converted to a chat-completions body (`to_chat_body`) and runs on the one chat
path; `ResponsesReply` renders the outcome as a `response` object or as the Responses event
stream. What llama-server does, and so what this module does:

- `previous_response_id` is refused: nothing is stored, there is no GET of a response;
- `text.format`, `tool_choice`, `store`, `include` ... pass through to the chat body untouched
  (llama's chat parser ignores what it does not know and reads an object `tool_choice` as
  "auto");
- a reply's `status` is always "completed", a length-limited one included;
- stream events carry no `output_index`, `content_index` nor `sequence_number`;
- the stream's `response.completed` lists every output item, but the deltas come only from the
  partial parses: the final parse's diffs are not sent (to_json_oaicompat_resp_stream).
"""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any

from edgeinfer.chat.message import MsgDiff, ToolCall
from edgeinfer.server.apis import ChatMeta, ChatOutcome, sse_frame
from edgeinfer.server.errors import bad_request

_ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_INPUT_ROLES = ("user", "system", "developer")

Event = tuple[str, dict]  # (event name, data), data["type"] repeating the name


def random_string() -> str:
    """llama-server's random_string (server-common.cpp): 32 characters of [0-9A-Za-z]."""
    return "".join(secrets.choice(_ALNUM) for _ in range(32))


def response_id() -> str:
    """A response's id, `resp_` + random_string (task_result_state's oai_resp_id); the route
    puts it in ChatMeta.id."""
    return "resp_" + random_string()


# -- request conversion (server_chat_convert_responses_to_chatcmpl) -------------------------
def _is_str(obj: Any, key: str) -> bool:
    """exists_and_is_string: a JSON object holding a string under `key`."""
    return isinstance(obj, dict) and isinstance(obj.get(key), str)


def _is_list(obj: Any, key: str) -> bool:
    """exists_and_is_array."""
    return isinstance(obj, dict) and isinstance(obj.get(key), list)


def _str_value(obj: dict, key: str) -> str:
    """json_value(obj, key, std::string()): a missing, null or non-string value reads as ""."""
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def to_chat_body(body: dict) -> dict:
    """server_chat_convert_responses_to_chatcmpl: the body minus `input`, `instructions`,
    `max_output_tokens` and `reasoning`, plus `messages` (instructions as a leading system
    message), chat `tools`, `max_tokens` and `reasoning_effort`. Every other field passes
    through for the chat path. A malformed request raises ApiError 400 with llama's message."""
    if not isinstance(body, dict) or "input" not in body:
        raise bad_request("'input' is required")
    if _str_value(body, "previous_response_id"):
        raise bad_request("llama.cpp does not support 'previous_response_id'.")
    chat = dict(body)
    input_value = chat.pop("input")
    messages = []
    if "instructions" in body:
        messages.append({"role": "system", "content": _str_value(body, "instructions")})
        del chat["instructions"]
    if isinstance(input_value, str):
        messages.append({"role": "user", "content": input_value})
    elif isinstance(input_value, list):
        for item in input_value:
            _add_item(messages, copy.deepcopy(item))
    else:
        raise bad_request("'input' must be a string or array of objects")
    chat["messages"] = messages
    if "tools" in body:
        _convert_tools(chat, body["tools"])
    if "max_output_tokens" in body:
        del chat["max_output_tokens"]
        chat["max_tokens"] = body["max_output_tokens"]
    if "reasoning" in body:  # only "effort" is handled, as llama-server does
        reasoning = chat.pop("reasoning")
        if isinstance(reasoning, dict) and "effort" in reasoning:
            chat["reasoning_effort"] = reasoning["effort"]
    return chat


def _add_item(messages: list[dict], item: Any) -> None:
    """One input item, recognised by its fields in llama's order; an assistant-side item
    right after an assistant message merges into it."""
    merge = bool(messages) and messages[-1].get("role") == "assistant"
    if _is_str(item, "content"):  # an "Input message" with text content: one input_text
        item["content"] = [{"text": item["content"], "type": "input_text"}]
    if _is_list(item, "content") and _is_str(item, "role") and item["role"] in _INPUT_ROLES:
        messages.append(_input_message(item))
    elif _is_str(item, "role") and item["role"] == "assistant" and _is_str(item, "type") \
            and item["type"] == "message":
        _add_output_message(messages, item, merge)
    elif all(_is_str(item, key) for key in ("arguments", "call_id", "name", "type")) \
            and item["type"] == "function_call":
        call = {"function": {"arguments": item["arguments"], "name": item["name"]},
                "id": item["call_id"], "type": "function"}
        if merge:
            prev = messages[-1]
            if not _is_list(prev, "tool_calls"):
                prev["tool_calls"] = []
            prev["tool_calls"].append(call)
        else:
            messages.append({"role": "assistant", "tool_calls": [call]})
    elif _is_str(item, "call_id") and (_is_str(item, "output") or _is_list(item, "output")) \
            and _is_str(item, "type") and item["type"] == "function_call_output":
        messages.append({"content": _tool_output(item["output"]), "role": "tool",
                         "tool_call_id": item["call_id"]})
    elif _is_list(item, "summary") and _is_str(item, "type") and item["type"] == "reasoning":
        _add_reasoning(messages, item, merge)
    else:
        raise bad_request("Cannot determine type of 'item'")


def _input_message(item: dict) -> dict:
    """An input message (user, system, developer): input_text -> text parts, input_image ->
    image_url parts; the item's other fields stay, less `type` and `status`."""
    parts = []
    for part in item["content"]:
        kind = _str_value(part, "type") if isinstance(part, dict) else ""
        if kind == "input_text":
            if "text" not in part:
                raise bad_request("'Input text' requires 'text'")
            parts.append({"text": part["text"], "type": "text"})
        elif kind == "input_image":  # `detail` defaults to "auto" and may be left out
            if "image_url" not in part:
                raise bad_request("'image_url' is required")
            parts.append({"image_url": {"url": part["image_url"]}, "type": "image_url"})
        elif kind == "input_file":
            raise bad_request("'input_file' is not supported by llamacpp at this moment")
        else:
            raise bad_request("'type' must be one of 'input_text', 'input_image', or "
                              "'input_file'")
    item.pop("type", None)
    item.pop("status", None)
    item["content"] = parts
    return item


def _output_parts(content: Any) -> list[dict]:
    """An output message's parts: output_text (or input_text, which string content became)
    -> text, refusal -> refusal; content that is no array gives no parts."""
    parts = []
    for part in content if isinstance(content, list) else []:
        kind = _str_value(part, "type") if isinstance(part, dict) else ""
        if kind in ("output_text", "input_text"):
            if not _is_str(part, "text"):
                raise bad_request("'Output text' requires 'text'")
            parts.append({"text": part["text"], "type": "text"})
        elif kind == "refusal":
            if not _is_str(part, "refusal"):
                raise bad_request("'Refusal' requires 'refusal'")
            parts.append({"refusal": part["refusal"], "type": "refusal"})
        else:
            raise bad_request("'type' must be one of 'output_text' or 'refusal'")
    return parts


def _add_output_message(messages: list[dict], item: dict, merge: bool) -> None:
    """An assistant output message, appended to the previous assistant message's content
    when there is one."""
    parts = _output_parts(item.get("content"))
    if merge:
        prev = messages[-1]
        if not _is_list(prev, "content"):
            prev["content"] = []
        prev["content"].extend(parts)
        return
    item.pop("status", None)
    item.pop("type", None)
    item["content"] = parts
    messages.append(item)


def _tool_output(output: str | list) -> str | list:
    """A function_call_output's output: a string as-is, or input_text / input_image parts
    as chat text / image_url parts."""
    if isinstance(output, str):
        return output
    for part in output:
        if not isinstance(part, dict) or "type" not in part:
            raise bad_request("Output of tool call missing 'type' field")
        if part["type"] not in ("input_text", "input_image"):
            raise bad_request("Output of tool call should be 'Input text' or 'Input image'")
        if part["type"] == "input_text":
            part["type"] = "text"
        else:
            if "image_url" not in part:
                raise bad_request("'image_url' is required")
            part["type"] = "image_url"
            part["image_url"] = {"url": part["image_url"]}
    return output


def _add_reasoning(messages: list[dict], item: dict, merge: bool) -> None:
    """A reasoning item: its first content part's text becomes `reasoning_content`, of the
    previous assistant message or of a new one with empty content."""
    if not _is_list(item, "content"):
        raise bad_request("item['content'] is not an array")
    if not item["content"]:
        raise bad_request("item['content'] is empty")
    if not _is_str(item["content"][0], "text"):
        raise bad_request("item['content']['text'] is not a string")
    text = item["content"][0]["text"]
    if merge:
        messages[-1]["reasoning_content"] = text
    else:
        messages.append({"role": "assistant", "content": [], "reasoning_content": text})


def _convert_tools(chat: dict, tools: Any) -> None:
    """Responses' flat function tools -> chat tools ({"type": "function", "function": {...}},
    `strict` defaulting to true); other tool types are skipped (llama logs a warning), and no
    function tool at all drops `tools`."""
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array of objects")
    converted = []
    for tool in tools:
        if not isinstance(tool, dict) or _str_value(tool, "type") != "function":
            continue
        function = {k: v for k, v in tool.items() if k != "type"}
        function.setdefault("strict", True)
        converted.append({"type": "function", "function": function})
    del chat["tools"]
    if converted:
        chat["tools"] = converted


def input_tokens_reply(body: dict, count: Callable[[dict], int]) -> dict:
    """POST /v1/responses/input_tokens (handle_count_tokens): the request converted, then
    `count(chat_body)` (the chat path's prompt, tokenized with add_special and parse_special)
    tokens, in llama's reply shape."""
    n_tokens = count(to_chat_body(body))
    return {"input_tokens": n_tokens, "object": "response.input_tokens"}


# -- replies (server_task_result_cmpl_final / _partial ::to_json_oaicompat_resp*) -----------
def _usage(outcome: ChatOutcome) -> dict:
    return {"input_tokens": outcome.n_prompt, "output_tokens": outcome.n_decoded,
            "total_tokens": outcome.n_decoded + outcome.n_prompt,
            "input_tokens_details": {"cached_tokens": outcome.n_cached}}


def _function_call_item(call: ToolCall, status: str) -> dict:
    """A function_call output item; llama derives both ids from the tool call's id."""
    return {"id": "fc_" + call.id, "type": "function_call", "status": status,
            "arguments": call.arguments, "call_id": "call_" + call.id, "name": call.name}


def _event(name: str, **fields: Any) -> Event:
    return name, {"type": name, **fields}


def _frames(events: Iterable[Event]) -> list[str]:
    """format_oai_resp_sse: an `event:` line and a `data:` line per event."""
    return [sse_frame(data, name) for name, data in events]


class ResponsesReply:
    """One request's reply: `reply()` for a non-stream request; for a stream, the frames of
    `progress()` (prompt progress, return_progress), `update()` (each partial parse's diffs),
    `end()` and `error()`. The stream opens (response.created, response.in_progress) with the
    first progress or update, as llama-server does with its first partial result; `start()`
    gives those frames now for a route that wants to open it itself."""

    def __init__(self, meta: ChatMeta, request: dict):
        self.meta, self.request = meta, request
        self.reasoning_id = "rs_" + random_string()  # the stream's item ids
        self.message_id = "msg_" + random_string()
        self.created = False  # response.created sent
        self.thinking_started = False  # the reasoning item added
        self.text_started = False  # the message item and its output_text part added
        self.fc_id = ""  # the tool call whose arguments stream now

    # -- non-stream --------------------------------------------------------------------------
    def reply(self, outcome: ChatOutcome) -> dict:
        """to_json_oaicompat_resp: reasoning, message and function_call items, each with a
        fresh id; both timestamps are the time of the reply, as in llama-server."""
        msg, output = outcome.message, []
        if msg.reasoning_content:
            output.append({"id": "rs_" + random_string(), "summary": [], "type": "reasoning",
                           "content": [{"text": msg.reasoning_content,
                                        "type": "reasoning_text"}],
                           "encrypted_content": "", "status": "completed"})
        if msg.content:
            output.append({"content": [{"type": "output_text", "annotations": [],
                                        "logprobs": [], "text": msg.content}],
                           "id": "msg_" + random_string(), "role": msg.role,
                           "status": "completed", "type": "message"})
        output.extend(_function_call_item(call, "completed") for call in msg.tool_calls)
        now = int(time.time())
        return {"completed_at": now, "created_at": now, "id": self.meta.id,
                "model": self.meta.model, "object": "response", "output": output,
                "status": "completed", "usage": _usage(outcome)}

    # -- stream ------------------------------------------------------------------------------
    def _status(self, name: str) -> Event:
        return _event(name, response={"id": self.meta.id, "object": "response",
                                      "status": "in_progress"})

    def _open(self) -> list[Event]:
        """response.created and response.in_progress, once."""
        if self.created:
            return []
        self.created = True
        return [self._status("response.created"), self._status("response.in_progress")]

    def start(self) -> list[str]:
        """The stream's opening frames, or none once sent."""
        return _frames(self._open())

    def progress(self, prompt_progress: dict, timings: dict | None = None) -> list[str]:
        """A prompt-progress partial (return_progress): the opening frames, or one more
        response.in_progress, the last carrying `timings` (timings_per_token) and
        `prompt_progress` ({"total", "cache", "processed", "time_ms"})."""
        events = self._open() or [self._status("response.in_progress")]
        if timings:
            events[-1][1]["timings"] = timings
        events[-1][1]["prompt_progress"] = prompt_progress
        return _frames(events)

    def update(self, diffs: Iterable[MsgDiff], timings: dict | None = None) -> list[str]:
        """A partial parse's diffs as events (the opening frames first if not yet sent);
        `timings` (timings_per_token) goes on the last event. Do not pass the final parse's
        diffs: llama-server sends none for them."""
        events = self._open()
        for diff in diffs:
            events += self._diff_events(diff)
        if events and timings:
            events[-1][1]["timings"] = timings
        return _frames(events)

    def _diff_events(self, diff: MsgDiff) -> list[Event]:
        events = []
        if diff.reasoning_content_delta:
            if not self.thinking_started:
                events.append(_event("response.output_item.added", item={
                    "id": self.reasoning_id, "summary": [], "type": "reasoning", "content": [],
                    "encrypted_content": "", "status": "in_progress"}))
                self.thinking_started = True
            events.append(_event("response.reasoning_text.delta",
                                 delta=diff.reasoning_content_delta, item_id=self.reasoning_id))
        if diff.content_delta:
            if not self.text_started:
                events.append(_event("response.output_item.added", item={
                    "content": [], "id": self.message_id, "role": "assistant",
                    "status": "in_progress", "type": "message"}))
                events.append(_event("response.content_part.added", item_id=self.message_id,
                                     part={"type": "output_text", "text": ""}))
                self.text_started = True
            events.append(_event("response.output_text.delta", item_id=self.message_id,
                                 delta=diff.content_delta))
        call = diff.tool_call_delta
        if call is not None and call.name:
            events.append(_event("response.output_item.added", item={
                "id": "fc_" + call.id, "arguments": "", "call_id": "call_" + call.id,
                "name": call.name, "type": "function_call", "status": "in_progress"}))
            self.fc_id = call.id
        if call is not None and call.arguments:
            events.append(_event("response.function_call_arguments.delta",
                                 delta=call.arguments, item_id="fc_" + self.fc_id))
        return events

    def end(self, outcome: ChatOutcome) -> list[str]:
        """to_json_oaicompat_resp_stream: each output item done (the stream's ids), then
        response.completed with every item, usage and, beside `response`, the timings."""
        msg, events, output = outcome.message, [], []
        if msg.reasoning_content:
            item = {"id": self.reasoning_id, "summary": [], "type": "reasoning",
                    "content": [{"text": msg.reasoning_content, "type": "reasoning_text"}],
                    "encrypted_content": ""}
            events.append(_event("response.output_item.done", item=item))
            output.append(item)
        if msg.content:
            part = {"type": "output_text", "annotations": [], "logprobs": [],
                    "text": msg.content}
            item = {"type": "message", "status": "completed", "id": self.message_id,
                    "content": [part], "role": "assistant"}
            events += [_event("response.output_text.done", item_id=self.message_id,
                              text=msg.content),
                       _event("response.content_part.done", item_id=self.message_id,
                              part=part),
                       _event("response.output_item.done", item=item)]
            output.append(item)
        for call in msg.tool_calls:
            item = _function_call_item(call, "completed")
            events.append(_event("response.output_item.done", item=item))
            output.append(item)
        events.append(_event("response.completed", response={
            "id": self.meta.id, "object": "response", "created_at": int(time.time()),
            "status": "completed", "model": self.meta.model, "output": output,
            "usage": _usage(outcome)}))
        if outcome.timings:
            events[-1][1]["timings"] = outcome.timings
        return _frames(events)

    def error(self, body: dict) -> list[str]:
        """An error after the stream began: a bare `data: {"error": {...}}` frame with no
        event line (format_oai_sse), then the stream ends. `body` is the envelope
        (ApiError.body()) or its inner object."""
        return [sse_frame(body if "error" in body else {"error": body})]
