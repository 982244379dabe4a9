"""Reading the assistant message back out of generated text, as llama.cpp does.

llama.cpp builds one PEG grammar per request from what rendering found
(autoparser::build_parser in common/chat-auto-parser-generator.cpp) and runs it on the
generation prompt followed by all the text generated so far, every time a piece arrives
(common_chat_peg_parse in common/chat.cpp). Re-reading the generation prompt is how a prompt
that ends inside an open `<think>` block (QwQ, DeepSeek-R1 with thinking on, or a continued
reasoning) still has its reasoning split out: the grammar starts at the generation prompt's
text before the reasoning start marker, so the marker the prompt already holds is read as if
the model had written it.

The grammar for a template without tools:

    prefix  [reasoning]  content

* prefix: the generation prompt up to the (trimmed) reasoning start marker;
* reasoning, when the reasoning format is not "none" and the template has markers:
  optionally `start` (its surrounding whitespace optional), the reasoning text up to the
  trimmed `end`, then `end`;
* content: the rest, or, when the template always wraps content in markers
  (Command R7B's <|START_RESPONSE|>...<|END_RESPONSE|>), the text inside them (with reasoning
  format "none", text before the start marker is content too).

Without reasoning markers the parts are joined directly, otherwise with optional
whitespace between the prefix and the rest. Streaming falls out of the lenient parse: a
marker cut by the end of the text is held back until it completes (peg.py).

With --no-jinja there is no grammar: everything generated is content.

With tools (and tool_choice not "none", and a template that renders tool calls), the body
is the tool-call format's grammar instead (tool_parser.py: content up to the call marker,
then the calls); the mapper (mapper.py) turns its tags into the message, tool calls
included. ChatParser also gives each call an id, once, as llama-server does.
"""

from __future__ import annotations

import logging
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from edgeinfer.chat import peg
from edgeinfer.chat.analysis import REASONING_NONE, REASONING_TAGS, REASONING_TOOLS_ONLY
from edgeinfer.chat.diff import trim
from edgeinfer.chat.mapper import CONTENT as CONTENT_TAG
from edgeinfer.chat.mapper import REASONING as REASONING_TAG
from edgeinfer.chat.mapper import message_from_tree, with_ids
from edgeinfer.chat.message import ChatMsg, MsgDiff, msg_diffs
from edgeinfer.chat.tool_analysis import ToolFormat
from edgeinfer.chat.tool_parser import TOOL_PARSERS
from edgeinfer.errors import EdgeInferError

log = logging.getLogger(__name__)

# Output formats (common_chat_format): no grammar; the generic grammar; everything after the
# generation prompt is content (--skip-chat-parsing).
FORMAT_CONTENT_ONLY, FORMAT_PEG, FORMAT_PURE_CONTENT = "content-only", "peg-native", "pure"

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


class ChatParseError(EdgeInferError):
    """The complete output does not match the template's format."""


@dataclass(frozen=True)
class ChatSyntax:
    """How to read one request's output: what rendering returned, kept with the request.

    `generation_prompt` is put back before the generated text; `prefix` is the part of it
    the grammar expects before the reasoning. `reasoning_*` come from the template analysis,
    `content_start`/`content_end` are set only when the template always wraps content.
    `is_continuation`: the prompt ends in a continued assistant message, whose text is part
    of `generation_prompt`. `tools` (OpenAI tool JSON) are set only when calls are parsed:
    the request has tools, tool_choice is not "none" and the template renders calls;
    `tool_format` is the template's call format, `tool_choice` "auto" or "required"."""

    format: str = FORMAT_CONTENT_ONLY
    generation_prompt: str = ""
    prefix: str = ""
    reasoning_format: str = "deepseek"
    reasoning_mode: str = REASONING_NONE
    reasoning_start: str = ""
    reasoning_end: str = ""
    content_start: str = ""
    content_end: str = ""
    is_continuation: bool = False
    tool_format: ToolFormat | None = None
    tools: tuple[dict, ...] = ()
    tool_choice: str = "auto"
    parallel_tool_calls: bool = False

    @property
    def extracting_reasoning(self) -> bool:
        return self.reasoning_format != "none" and self.reasoning_mode != REASONING_NONE

    @property
    def starts_in_reasoning(self) -> bool:
        """The prompt leaves the model inside an open reasoning block (QwQ, DeepSeek-R1, a
        continued reasoning): the generation prompt after the prefix opens the reasoning
        start marker and does not close it. The grammar needs no flag for this, since it
        re-reads the generation prompt; a stream may want to open its thinking block."""
        tail = self.generation_prompt[len(self.prefix):]
        start, end = trim(self.reasoning_start), trim(self.reasoning_end)
        return bool(start) and tail.startswith(start) and not (end and end in tail)


def reasoning_parser(syntax: ChatSyntax) -> peg.Parser:
    """analyze_reasoning::build_parser."""
    if not syntax.extracting_reasoning or not syntax.reasoning_end \
            or syntax.reasoning_mode not in (REASONING_TAGS, REASONING_TOOLS_ONLY):
        return peg.eps()
    body = peg.tag(REASONING_TAG, peg.until(trim(syntax.reasoning_end))) \
        + peg.optspace(syntax.reasoning_end)
    if syntax.reasoning_start:
        body = peg.optspace(syntax.reasoning_start) + body
    return peg.optional(body)


def content_parser(syntax: ChatSyntax, reasoning: peg.Parser) -> peg.Parser:
    """analyze_content::build_parser."""
    start, end = syntax.content_start, syntax.content_end
    if not (start and end):
        return reasoning + peg.tag(CONTENT_TAG, peg.rest()) + peg.end()
    wrapped = peg.literal(start) + peg.tag(CONTENT_TAG, peg.until(end)) + end + peg.end()
    if syntax.extracting_reasoning:
        return reasoning + wrapped
    return peg.tag(CONTENT_TAG, peg.until(start)) + wrapped


def build_parser(syntax: ChatSyntax) -> peg.Parser:
    """The grammar for one request (common_chat_peg_parse's default parser,
    autoparser::build_parser, or --skip-chat-parsing's)."""
    if syntax.format == FORMAT_CONTENT_ONLY:
        return peg.tag(CONTENT_TAG, peg.rest()) + peg.end()
    if syntax.format == FORMAT_PURE_CONTENT:
        return peg.literal(syntax.generation_prompt) << peg.tag(CONTENT_TAG, peg.rest())
    reasoning = reasoning_parser(syntax)
    tool_body = tool_body_parser(syntax)
    if tool_body is not None:
        return peg.literal(syntax.prefix) << tool_body(syntax, reasoning)
    body = content_parser(syntax, reasoning)
    if syntax.reasoning_mode == REASONING_NONE:
        return peg.literal(syntax.prefix) + body
    return peg.literal(syntax.prefix) << body


def tool_body_parser(syntax: ChatSyntax) -> Callable | None:
    """The builder of the tool-call grammar, when calls are parsed and their format is
    known. (llama.cpp builds an empty grammar for a format it could not analyse, so that
    such a template fails with tools; here its output is read as content.)"""
    if not syntax.tools or syntax.tool_format is None:
        return None
    return TOOL_PARSERS.get(syntax.tool_format.mode)


def parse_output(parser: peg.Parser, syntax: ChatSyntax, text: str, partial: bool) -> ChatMsg:
    """common_chat_peg_parse: `text` is everything generated so far. A partial text that
    does not fit the grammar (yet) is an empty message; a complete one raises."""
    source = syntax.generation_prompt + text
    result = peg.parse(parser, source, lenient=True)
    if result.fail:
        if partial and result.end > 0:
            return ChatMsg()
        log.warning("unparsed %s output: %r", syntax.format, source[result.end:])
        raise ChatParseError("The model produced output that does not match the expected "
                             f"{syntax.format} format")
    return message_from_tree(result)


_ID_CHARS = string.digits + string.ascii_uppercase + string.ascii_lowercase


def gen_tool_call_id() -> str:
    """llama-server's gen_tool_call_id: 32 random letters and digits."""
    return "".join(random.SystemRandom().choice(_ID_CHARS) for _ in range(32))


class ChatParser:
    """Feeds on generated text piece by piece and says what each piece added.

    `feed(piece)` returns the MsgDiffs since the previous piece (reasoning first, then
    content, then tool calls: a call appears with its name and id once its name is complete,
    then its arguments grow; a marker still incomplete yields nothing yet); `finish()` parses
    the whole text as complete and returns the last diffs; `message` is the message so far.
    With a continued assistant message, its prefilled text is part of `message` from the
    start but is not sent as a diff unless `echo` (llama.cpp's task_result_state).

    `tool_call_id` makes the id of a call the model did not give one (a new one per call,
    kept for the whole stream, as llama-server's set_tool_call_ids); None leaves ids as
    parsed (llama.cpp's parser tests)."""

    def __init__(self, syntax: ChatSyntax, *, echo: bool = False,
                 tool_call_id: Callable[[], str] | None = gen_tool_call_id):
        self.syntax = syntax
        self.text = ""
        self._parser = build_parser(syntax)
        self._new_id = tool_call_id
        self._ids: list[str] = []
        self.message = ChatMsg()
        if syntax.is_continuation and not echo:
            self.message = parse_output(self._parser, syntax, "", partial=True)

    def feed(self, piece: str) -> list[MsgDiff]:
        self.text += piece
        return self._update(partial=True)

    def finish(self, piece: str = "") -> list[MsgDiff]:
        """The generation ended (its last piece may come with the call)."""
        self.text += piece
        return self._update(partial=False)

    def _update(self, partial: bool) -> list[MsgDiff]:
        new = parse_output(self._parser, self.syntax, self.text, partial)
        if new.empty():
            return []
        if self._new_id is not None:
            new = with_ids(new, self._ids, self._new_id)
        diffs = msg_diffs(self.message, new)
        self.message = new
        return diffs
