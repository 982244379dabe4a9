"""Chat: templates that turn messages into a prompt (template.py), and the assistant message
read back out of the generated text (message.py: content, reasoning, tool calls)."""

from edgeinfer.chat.message import ChatMsg, MsgDiff, ToolCall, msg_diffs
from edgeinfer.chat.template import CHATML_TEMPLATE, compile_template, render_chat

__all__ = ["CHATML_TEMPLATE", "ChatMsg", "MsgDiff", "ToolCall", "compile_template",
           "msg_diffs", "render_chat"]
