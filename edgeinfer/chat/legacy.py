"""llama.cpp's built-in chat formats, used with --no-jinja (src/llama-chat.cpp).

`detect_template(source)` is llm_chat_detect_template: a built-in name ("llama3",
"command-r", ...) names its format; any other text is recognised by substrings of the
well-known Jinja templates. `format_chat(name, chat, add_ass)` is llm_chat_apply_template.

Most formats are data: each message is `before + content + after` by role (`*` for any
other role; a format without `*` drops other roles), `{role}` / `{Role}` / `{ROLE}` stand for
the role as is, capitalised, upper-cased; `trim` lists the roles whose content is stripped
(`*`: all). The formats that depend on a message's position or merge system messages are
functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Chat = list[tuple[str, str]]  # (role, content)


@dataclass(frozen=True)
class Turns:
    roles: tuple[tuple[str, str, str], ...]  # (role or "*", before, after)
    generation: str = ""  # appended when add_ass
    trim: tuple[str, ...] = ()
    start: str = ""

    def _parts(self, role: str) -> tuple[str, str] | None:
        for name, before, after in self.roles:
            if name in (role, "*"):
                return before, after
        return None

    def format(self, chat: Chat, add_ass: bool) -> str:
        out = [self.start]
        for role, content in chat:
            parts = self._parts(role)
            if parts is None:
                continue
            if role in self.trim or "*" in self.trim:
                content = _trim(content)
            before, after = (_fill(p, role) for p in parts)
            out.append(before + content + after)
        if add_ass:
            out.append(self.generation)
        return "".join(out)


def _fill(text: str, role: str) -> str:
    return (text.replace("{role}", role).replace("{Role}", role[:1].upper() + role[1:])
            .replace("{ROLE}", role.upper()))


def _trim(text: str) -> str:
    return text.strip(" \t\n\v\f\r")


# -- formats that are functions ---------------------------------------------------------------
def _mistral_v1_v3(leading: str, trailing: str, trim_assistant: bool):
    def format_chat(chat: Chat, add_ass: bool) -> str:
        out, inside_turn = "", False
        for role, content in chat:
            if not inside_turn:
                out, inside_turn = out + leading + "[INST]" + trailing, True
            if role == "system":
                out += content + "\n\n"
            elif role == "user":
                out += content + leading + "[/INST]"
            else:
                out += trailing + (_trim(content) if trim_assistant else content) + "</s>"
                inside_turn = False
        return out
    return format_chat


def _llama2(system: bool, bos_in_history: bool, strip: bool):
    def format_chat(chat: Chat, add_ass: bool) -> str:
        out, inside_turn = "[INST] ", True
        for role, content in chat:
            content = _trim(content) if strip else content
            if not inside_turn:
                out, inside_turn = out + ("<s>[INST] " if bos_in_history else "[INST] "), True
            if role == "system":
                out += f"<<SYS>>\n{content}\n<</SYS>>\n\n" if system else content + "\n"
            elif role == "user":
                out += content + " [/INST]"
            else:
                out, inside_turn = out + content + "</s>", False
        return out
    return format_chat


def _monarch(chat: Chat, add_ass: bool) -> str:
    out = "".join(("" if i == 0 else "<s>") + f"{role}\n{content}</s>\n"
                  for i, (role, content) in enumerate(chat))
    return out + ("<s>assistant\n" if add_ass else "")


def _gemma(chat: Chat, add_ass: bool) -> str:
    """System text goes in front of the next user turn; the assistant is "model"."""
    out, system = "", ""
    for role, content in chat:
        if role == "system":
            system += _trim(content)
            continue
        role = "model" if role == "assistant" else role
        out += f"<start_of_turn>{role}\n"
        if system and role != "model":
            out, system = out + system + "\n\n", ""
        out += _trim(content) + "<end_of_turn>\n"
    return out + ("<start_of_turn>model\n" if add_ass else "")


def _orion(chat: Chat, add_ass: bool) -> str:
    out, system = "", ""
    for role, content in chat:
        if role == "system":
            system += content
        elif role == "user":
            out += "Human: " + (system + "\n\n" if system else "")
            out, system = out + content + "\n\nAssistant: </s>", ""
        else:
            out += content + "</s>"
    return out


def _rwkv_world(chat: Chat, add_ass: bool) -> str:
    names = {"system": "System", "user": "User", "assistant": "Assistant"}
    out = ""
    for i, (role, content) in enumerate(chat):
        if role in names:
            out += f"{names[role]}: {_trim(content)}\n\n"
            if role == "user" and i == len(chat) - 1:
                out += "Assistant:"
    return out


def _gigachat(chat: Chat, add_ass: bool) -> str:
    has_system = bool(chat) and chat[0][0] == "system"
    out = "<s>" + (chat[0][1] + "<|message_sep|>" if has_system else "")
    for role, content in chat[1 if has_system else 0:]:
        if role == "user":
            out += (f"user<|role_sep|>{content}<|message_sep|>"
                    "available functions<|role_sep|>[]<|message_sep|>")
        elif role == "assistant":
            out += f"assistant<|role_sep|>{content}<|message_sep|>"
    return out + ("assistant<|role_sep|>" if add_ass else "")


def _bailing2(chat: Chat, add_ass: bool) -> str:
    has_system = bool(chat) and chat[0][0] == "system"
    start = "" if has_system else "<role>SYSTEM</role>detailed thinking off<|role_end|>"
    turns = Turns((("user", "<role>HUMAN</role>", "<|role_end|>"),
                   ("*", "<role>{ROLE}</role>", "<|role_end|>")), "<role>ASSISTANT</role>")
    return start + turns.format(chat, add_ass)


def _pangu_embedded(chat: Chat, add_ass: bool) -> str:
    names = {"system": "系统", "user": "用户", "assistant": "助手", "tool": "工具",
             "function": "方法"}
    out = "[unused9]系统：[unused10]" if chat and chat[0][0] != "system" else ""
    for role, content in chat:
        if role in names:
            out += f"[unused9]{names[role]}：{content}[unused10]"
    return out + ("[unused9]助手：" if add_ass else "")


def _hunyuan_dense(chat: Chat, add_ass: bool) -> str:
    out = ""
    for i, (role, content) in enumerate(chat):
        if i == 0 and role == "system":
            out += content + "<｜hy_place▁holder▁no▁3｜>"
        if role == "assistant":
            out += "<｜hy_Assistant｜>" + content + "<｜hy_place▁holder▁no▁2｜>"
        elif role == "user":
            out += "<｜hy_User｜>" + content + "<｜hy_Assistant｜>"
    return out


def _hunyuan_vl(chat: Chat, add_ass: bool) -> str:
    out = "<｜hy_begin▁of▁sentence｜>"
    for i, (role, content) in enumerate(chat):
        if i == 0 and role == "system":
            out += content + "<｜hy_place▁holder▁no▁3｜>"
        elif role == "user":
            out += content + "<｜hy_User｜>"
        elif role == "assistant":
            out += content + "<｜hy_Assistant｜>"
    return out


def _mistral_v7(space: str) -> Turns:
    return Turns((("system", f"[SYSTEM_PROMPT]{space}", "[/SYSTEM_PROMPT]"),
                  ("user", f"[INST]{space}", "[/INST]"), ("*", space, "</s>")))


_GRANITE_4 = Turns((("assistant_tool_call", "<|start_of_role|>assistant<|end_of_role|>"
                     "<|tool_call|>", "<|end_of_text|>\n"),
                    ("*", "<|start_of_role|>{role}<|end_of_role|>", "<|end_of_text|>\n")),
                   "<|start_of_role|>assistant<|end_of_role|>")
_BAILING = (("user", "<role>HUMAN</role>", ""), ("*", "<role>{ROLE}</role>", ""))
_VICUNA = (("user", "USER: ", "\n"), ("assistant", "ASSISTANT: ", "</s>\n"))
_EXAONE = (("system", "[|system|]", "[|endofturn|]\n"), ("user", "[|user|]", "\n"),
           ("assistant", "[|assistant|]", "[|endofturn|]\n"))

FORMATS: dict[str, Turns | Callable[[Chat, bool], str]] = {
    "chatml": Turns((("*", "<|im_start|>{role}\n", "<|im_end|>\n"),), "<|im_start|>assistant\n"),
    "llama2": _llama2(system=False, bos_in_history=False, strip=False),
    "llama2-sys": _llama2(system=True, bos_in_history=False, strip=False),
    "llama2-sys-bos": _llama2(system=True, bos_in_history=True, strip=False),
    "llama2-sys-strip": _llama2(system=True, bos_in_history=False, strip=True),
    "mistral-v1": _mistral_v1_v3(" ", " ", trim_assistant=False),
    "mistral-v3": _mistral_v1_v3("", " ", trim_assistant=True),
    "mistral-v3-tekken": _mistral_v1_v3("", "", trim_assistant=False),
    "mistral-v7": _mistral_v7(" "),
    "mistral-v7-tekken": _mistral_v7(""),
    "phi3": Turns((("*", "<|{role}|>\n", "<|end|>\n"),), "<|assistant|>\n"),
    "phi4": Turns((("*", "<|im_start|>{role}<|im_sep|>", "<|im_end|>"),),
                  "<|im_start|>assistant<|im_sep|>"),
    "falcon3": Turns((("*", "<|{role}|>\n", "\n"),), "<|assistant|>\n"),
    "zephyr": Turns((("*", "<|{role}|>\n", "<|endoftext|>\n"),), "<|assistant|>\n"),
    "monarch": _monarch,
    "gemma": _gemma,
    "orion": _orion,
    "openchat": Turns((("system", "", "<|end_of_turn|>"),
                       ("*", "GPT4 Correct {Role}: ", "<|end_of_turn|>")),
                      "GPT4 Correct Assistant:"),
    "vicuna": Turns((("system", "", "\n\n"), *_VICUNA), "ASSISTANT:"),
    "vicuna-orca": Turns((("system", "SYSTEM: ", "\n"), *_VICUNA), "ASSISTANT:"),
    "deepseek": Turns((("system", "", ""), ("user", "### Instruction:\n", "\n"),
                       ("assistant", "### Response:\n", "\n<|EOT|>\n")), "### Response:\n"),
    "deepseek2": Turns((("system", "", "\n\n"), ("user", "User: ", "\n\n"),
                        ("assistant", "Assistant: ", "<｜end▁of▁sentence｜>")), "Assistant:"),
    "deepseek3": Turns((("system", "", "\n\n"), ("user", "<｜User｜>", ""),
                        ("assistant", "<｜Assistant｜>", "<｜end▁of▁sentence｜>")),
                       "<｜Assistant｜>"),
    "deepseek-ocr": Turns((("*", "", ""),)),
    "command-r": Turns(tuple((role, f"<|START_OF_TURN_TOKEN|><|{token}_TOKEN|>",
                              "<|END_OF_TURN_TOKEN|>")
                             for role, token in (("system", "SYSTEM"), ("user", "USER"),
                                                 ("assistant", "CHATBOT"))),
                       "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", trim=("*",)),
    "llama3": Turns((("*", "<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>"),),
                    "<|start_header_id|>assistant<|end_header_id|>\n\n", trim=("*",)),
    "chatglm3": Turns((("*", "<|{role}|>\n ", ""),), "<|assistant|>", start="[gMASK]sop"),
    "chatglm4": Turns((("*", "<|{role}|>\n", ""),), "<|assistant|>\n", start="[gMASK]<sop>"),
    "glmedge": Turns((("*", "<|{role}|>\n", ""),), "<|assistant|>"),
    "minicpm": Turns((("user", "<用户>", "<AI>"), ("*", "", "")), trim=("*",)),
    "exaone3": Turns(_EXAONE, "[|assistant|]", trim=("*",)),
    "exaone4": Turns((*_EXAONE, ("tool", "[|tool|]", "[|endofturn|]\n")), "[|assistant|]",
                     trim=("*",)),
    "exaone-moe": Turns(tuple((role, f"<|{role}|>\n", "<|endofturn|>\n")
                              for role in ("system", "user", "assistant", "tool")),
                        "<|assistant|>\n", trim=("*",)),
    "rwkv-world": _rwkv_world,
    "granite": Turns((("assistant_tool_call", "<|start_of_role|>assistant_tool_call"
                       "<|end_of_role|><|tool_call|>", "<|end_of_text|>\n"),
                      ("*", "<|start_of_role|>{role}<|end_of_role|>", "<|end_of_text|>\n")),
                     "<|start_of_role|>assistant<|end_of_role|>"),
    "granite-4.0": _GRANITE_4,
    "granite-4.1": _GRANITE_4,
    "gigachat": _gigachat,
    "megrez": Turns((("*", "<|role_start|>{role}<|role_end|>", "<|turn_end|>"),),
                    "<|role_start|>assistant<|role_end|>"),
    "yandex": Turns((("user", " Пользователь: ", "\n\n"), ("assistant", " Ассистент: ", "\n\n")),
                    " Ассистент:[SEP]"),
    "bailing": Turns(_BAILING, "<role>ASSISTANT</role>"),
    "bailing-think": Turns(_BAILING, "<role>ASSISTANT</role><think>"),
    "bailing2": _bailing2,
    "llama4": Turns((("*", "<|header_start|>{role}<|header_end|>\n\n", "<|eot|>"),),
                    "<|header_start|>assistant<|header_end|>\n\n", trim=("*",)),
    "smolvlm": Turns((("system", "", "\n\n"), ("user", "User: ", "<end_of_utterance>\n"),
                      ("*", "Assistant: ", "<end_of_utterance>\n")), "Assistant:",
                     start="<|im_start|>"),
    "hunyuan-moe": Turns((("system", "<|startoftext|>", "<|extra_4|>"),
                          ("assistant", "", "<|eos|>"), ("*", "<|startoftext|>", "<|extra_0|>"))),
    "gpt-oss": Turns((("assistant", "<|start|>assistant<|message|>", "<|return|>"),
                      ("*", "<|start|>{role}<|message|>", "<|end|>")), "<|start|>assistant"),
    "hunyuan-dense": _hunyuan_dense,
    "hunyuan-vl": _hunyuan_vl,
    "kimi-k2": Turns((("system", "<|im_system|>system<|im_middle|>", "<|im_end|>"),
                      ("user", "<|im_user|>user<|im_middle|>", "<|im_end|>"),
                      ("assistant", "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>"),
                      ("tool", "<|im_system|>tool<|im_middle|>", "<|im_end|>"),
                      ("*", "", "<|im_end|>")), "<|im_assistant|>assistant<|im_middle|>"),
    "seed_oss": Turns((("*", "<seed:bos>{role}\n", "<seed:eos>"),), "<seed:bos>assistant\n",
                      trim=("assistant",)),
    "grok-2": Turns((("system", "System: ", "<|separator|>\n\n"),
                     ("user", "Human: ", "<|separator|>\n\n"),
                     ("assistant", "Assistant: ", "<|separator|>\n\n")), "Assistant:",
                    trim=("system", "user")),
    "pangu-embedded": _pangu_embedded,
    "solar-open": Turns((("*", "<|begin|>{role}<|content|>", "<|end|>"),), "<|begin|>assistant"),
    # Found by detection only: llama.cpp has no name for it.
    "dots1": Turns((("system", "<|system|>", "<|endofsystem|>"),
                    ("user", "<|userprompt|>", "<|endofuserprompt|>"),
                    ("*", "<|response|>", "<|endofresponse|>")), "<|response|>"),
}

# The names --chat-template accepts (LLM_CHAT_TEMPLATES); llama-server lists them in --help.
BUILTIN_TEMPLATES: tuple[str, ...] = tuple(sorted(n for n in FORMATS if n != "dots1"))


def _has(*needles: str) -> Callable[[str], bool]:
    return lambda src: all(n in src for n in needles)


def _mistral(src: str) -> bool:
    return src.startswith("mistral") or "[INST]" in src


def _official_mistral(src: str) -> bool:
    return _mistral(src) and "[SYSTEM_PROMPT]" not in src and (
        "' [INST] ' + system_message" in src or "[AVAILABLE_TOOLS]" in src)


def _llama2_family(src: str) -> bool:
    return _mistral(src) and "[SYSTEM_PROMPT]" not in src and not _official_mistral(src)


# llm_chat_detect_template's if-chain, in its order: the first rule that holds wins.
DETECTION_RULES: tuple[tuple[Callable[[str], bool], str], ...] = (
    (_has("<|im_start|>", "<|im_sep|>"), "phi4"),
    (_has("<|im_start|>", "<end_of_utterance>"), "smolvlm"),
    (_has("<|im_start|>"), "chatml"),
    (lambda s: _mistral(s) and "[SYSTEM_PROMPT]" in s, "mistral-v7"),
    (lambda s: _official_mistral(s) and " [INST]" in s, "mistral-v1"),
    (lambda s: _official_mistral(s) and '"[INST]"' in s, "mistral-v3-tekken"),
    (_official_mistral, "mistral-v3"),
    (lambda s: _llama2_family(s) and "content.strip()" in s, "llama2-sys-strip"),
    (lambda s: _llama2_family(s) and "bos_token + '[INST]" in s, "llama2-sys-bos"),
    (lambda s: _llama2_family(s) and "<<SYS>>" in s, "llama2-sys"),
    (_llama2_family, "llama2"),
    (_has("<|assistant|>", "<|end|>"), "phi3"),
    (_has("[gMASK]<sop>"), "chatglm4"),
    (_has("<|assistant|>", "<|user|>", "<|tool_declare|>"), "exaone-moe"),
    (_has("<|assistant|>", "<|user|>", "</s>"), "falcon3"),
    (_has("<|assistant|>", "<|user|>"), "glmedge"),
    (_has("<|{{ item['role'] }}|>", "<|begin_of_image|>"), "glmedge"),
    (_has("<|user|>", "<|endoftext|>"), "zephyr"),
    (_has("bos_token + message['role']"), "monarch"),
    (_has("<start_of_turn>"), "gemma"),
    (_has("'\\n\\nAssistant: ' + eos_token"), "orion"),
    (_has("GPT4 Correct "), "openchat"),
    (_has("USER: ", "ASSISTANT: ", "SYSTEM: "), "vicuna-orca"),
    (_has("USER: ", "ASSISTANT: "), "vicuna"),
    (_has("### Instruction:", "<|EOT|>"), "deepseek"),
    (_has("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"), "command-r"),
    (_has("<|start_header_id|>", "<|end_header_id|>"), "llama3"),
    (_has("[gMASK]sop"), "chatglm3"),
    (_has("<用户>"), "minicpm"),
    (_has("'Assistant: ' + message['content'] + eos_token"), "deepseek2"),
    (_has("<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"), "deepseek3"),
    (_has("[|system|]", "[|assistant|]", "[|endofturn|]", "[|tool|]"), "exaone4"),
    (_has("[|system|]", "[|assistant|]", "[|endofturn|]"), "exaone3"),
    (lambda s: "rwkv-world" in s or "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}" in s,
     "rwkv-world"),
    (lambda s: "<|start_of_role|>" in s and ("<tool_call>" in s or "<tools>" in s)
     and "g4_default_system_message" in s, "granite-4.0"),
    (lambda s: "<|start_of_role|>" in s and ("<tool_call>" in s or "<tools>" in s),
     "granite-4.1"),
    (_has("<|start_of_role|>"), "granite"),
    (_has("message['role'] + additional_special_tokens[0] + message['content'] + "
          "additional_special_tokens[1]"), "gigachat"),
    (_has("<|role_start|>"), "megrez"),
    (_has(" Ассистент:"), "yandex"),
    (_has("<role>ASSISTANT</role>", "'HUMAN'"), "bailing"),
    (_has("<role>ASSISTANT</role>", '"HUMAN"', "<think>"), "bailing-think"),
    (_has("<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"), "bailing2"),
    (_has("<|header_start|>", "<|header_end|>"), "llama4"),
    (_has("<|endofuserprompt|>"), "dots1"),
    (_has("<|extra_0|>", "<|extra_4|>"), "hunyuan-moe"),
    (_has("<|start|>", "<|channel|>"), "gpt-oss"),
    (_has("<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>"), "hunyuan-vl"),
    (_has("<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>"), "hunyuan-dense"),
    (_has("<|im_assistant|>assistant<|im_middle|>"), "kimi-k2"),
    (_has("<seed:bos>"), "seed_oss"),
    (_has("'Assistant: '  + message['content'] + '<|separator|>"), "grok-2"),
    (_has("[unused9]系统：[unused10]"), "pangu-embedded"),
    (_has("<|begin|>", "<|end|>", "<|content|>"), "solar-open"),
)


def detect_template(source: str) -> str | None:
    """llm_chat_detect_template: the built-in format a name or a template source stands
    for, None when unknown."""
    if source in BUILTIN_TEMPLATES:
        return source
    for rule, name in DETECTION_RULES:
        if rule(source):
            return name
    return None


def format_chat(name: str, chat: Chat, add_ass: bool) -> str:
    """llm_chat_apply_template for a format found by detect_template."""
    fmt = FORMATS[name]
    return fmt.format(chat, add_ass) if isinstance(fmt, Turns) else fmt(chat, add_ass)
