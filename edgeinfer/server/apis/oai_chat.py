"""OpenAI chat completions (/v1/chat/completions) from parsed messages and their diffs:
server_task_result_cmpl_final::to_json_oaicompat_chat(_stream) and the partial result's
to_json_oaicompat_chat (tools/server/server-task.cpp), with reasoning_content and tool calls
as common_chat_msg::to_json_oaicompat and server_chat_msg_diff_to_json_oaicompat write them.
Several choices (n > 1) share one id; each chunk names its choice's index.
"""

from __future__ import annotations

from edgeinfer.chat.message import ChatMsg, MsgDiff
from edgeinfer.server.apis import ChatMeta, ChatOutcome

BUILD_INFO_KEY = "system_fingerprint"


def message_json(msg: ChatMsg) -> dict:
    """common_chat_msg::to_json_oaicompat."""
    out = {"role": msg.role, "content": msg.content}
    if msg.reasoning_content:
        out["reasoning_content"] = msg.reasoning_content
    if msg.tool_calls:
        out["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments},
             **({"id": c.id} if c.id else {})} for c in msg.tool_calls]
    return out


def delta_json(diff: MsgDiff) -> dict:
    """server_chat_msg_diff_to_json_oaicompat."""
    delta = {}
    if diff.reasoning_content_delta:
        delta["reasoning_content"] = diff.reasoning_content_delta
    if diff.content_delta:
        delta["content"] = diff.content_delta
    call = diff.tool_call_delta
    if diff.tool_call_index >= 0 and call is not None:
        tool_call: dict = {"index": diff.tool_call_index}
        if call.id:
            tool_call.update(id=call.id, type="function")
        function = {k: v for k, v in (("name", call.name), ("arguments", call.arguments)) if v}
        if function:
            tool_call["function"] = function
        delta["tool_calls"] = [tool_call]
    return delta


def finish_reason(outcome: ChatOutcome) -> str:
    if outcome.finish_reason == "length":
        return "length"
    return "tool_calls" if outcome.message.tool_calls else "stop"


def usage_json(outcomes: list[ChatOutcome]) -> dict:
    """usage_json_oaicompat, summed over the choices."""
    n_prompt = sum(o.n_prompt for o in outcomes)
    n_decoded = sum(o.n_decoded for o in outcomes)
    return {"completion_tokens": n_decoded, "prompt_tokens": n_prompt,
            "total_tokens": n_prompt + n_decoded,
            "prompt_tokens_details": {"cached_tokens": sum(o.n_cached for o in outcomes)}}


class OaiChatReply:
    """One request's reply: `reply` for all choices at once, `partial` and `final` for the
    stream chunks of one choice's events (dicts; the route frames them as SSE)."""

    def __init__(self, meta: ChatMeta, fingerprint: str, include_usage: bool = False):
        self.meta, self.fingerprint, self.include_usage = meta, fingerprint, include_usage

    def _head(self, obj: str) -> dict:
        return {"id": self.meta.id, "object": obj, "created": self.meta.created,
                "model": self.meta.model, BUILD_INFO_KEY: self.fingerprint}

    def reply(self, outcomes: list[ChatOutcome], logprobs: list[list[dict]] | None) -> dict:
        choices = []
        for i, outcome in enumerate(outcomes):
            choice = {"index": i, "finish_reason": finish_reason(outcome),
                      "message": message_json(outcome.message)}
            if logprobs is not None:
                choice["logprobs"] = {"content": logprobs[i]}
            choices.append(choice)
        return {**self._head("chat.completion"), "choices": choices,
                "usage": usage_json(outcomes), "timings": outcomes[0].timings}

    def _chunk(self, index: int, delta: dict, finish: str | None = None) -> dict:
        return {**self._head("chat.completion.chunk"),
                "choices": [{"index": index, "finish_reason": finish, "delta": delta}]}

    def partial(self, index: int, diffs: list[MsgDiff], first: bool,
                logprobs: list[dict] | None = None, timings: dict | None = None,
                progress: dict | None = None) -> list[dict]:
        """A token's (or prompt progress's) chunks: the role first, then one per diff; the
        last carries the token's logprobs, timings and progress. No diff: nothing."""
        chunks = [self._chunk(index, {"role": "assistant", "content": None})] \
            if first or progress is not None else []
        chunks += [self._chunk(index, delta_json(d)) for d in diffs]
        if chunks:
            last = chunks[-1]
            if logprobs:
                last["choices"][0]["logprobs"] = {"content": logprobs}
            if timings is not None:
                last["timings"] = timings
            if progress is not None:
                last["prompt_progress"] = progress
        return chunks

    def final(self, index: int, diffs: list[MsgDiff], outcome: ChatOutcome,
              first: bool = False) -> list[dict]:
        """The last chunks of a choice: its final diffs, the finish reason, usage if asked;
        the timings on the last of them."""
        chunks = [self._chunk(index, {"role": "assistant", "content": None})] if first else []
        chunks += [self._chunk(index, delta_json(d)) for d in diffs]
        chunks.append(self._chunk(index, {}, finish_reason(outcome)))
        if self.include_usage:
            chunks.append({**self._head("chat.completion.chunk"), "choices": [],
                           "usage": usage_json([outcome])})
        chunks[-1]["timings"] = outcome.timings
        return chunks

