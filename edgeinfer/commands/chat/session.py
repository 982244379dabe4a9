"""A chat conversation's state: the messages (OpenAI's form), the system prompt, the
sampling settings `/set` changes, and the window of turns still in the context."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from edgeinfer.errors import EdgeInferError
from edgeinfer.sampling_params import N_PREDICT, SamplingParams

# /set NAME VALUE: our names, llama.cpp's and Ollama's spellings
SETTINGS = {"temp": "temperature", "temperature": "temperature", "top_k": "top_k",
            "top_p": "top_p", "min_p": "min_p", "repeat_penalty": "repeat_penalty",
            "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
            "frequency_penalty": "frequency_penalty", "seed": "seed",
            "n_predict": "n_predict", "num_predict": "n_predict", "n": "n_predict"}


class ContextFull(EdgeInferError):
    """The conversation no longer fits the context; `drop_oldest` makes room."""


@dataclass
class Conversation:
    system: str | None = None
    messages: list[dict] = field(default_factory=list)  # user and assistant turns
    first: int = 0  # messages[:first] were shifted out of the context (still saved)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = N_PREDICT

    def context(self) -> list[dict]:
        """What the model sees: the system prompt and the turns still in the window."""
        return self.all_messages(self.first)

    def all_messages(self, first: int = 0) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages[first:]

    def drop_oldest(self) -> int:
        """llama.cpp's context shift at turn granularity: keep the system prompt, drop the
        oldest user turn and its answer. Returns how many messages left the window (0: only
        the newest user message is left, nothing more to drop)."""
        live = self.messages[self.first:]
        if len(live) <= 1:
            return 0
        n = 1
        while n < len(live) - 1 and live[n]["role"] != "user":
            n += 1  # the answer (and any more) up to the next user turn
        self.first += n
        return n

    def clear(self) -> None:
        self.messages, self.first = [], 0

    def set(self, name: str, value: str) -> str:
        """/set NAME VALUE; returns the setting as it now reads."""
        key = SETTINGS.get(name.lower())
        if key is None:
            raise EdgeInferError(f"unknown setting '{name}'; settings: "
                                 + ", ".join(sorted(set(SETTINGS))))
        kind = int if key in ("top_k", "repeat_last_n", "seed", "n_predict") else float
        try:
            number = kind(value)
        except ValueError:
            raise EdgeInferError(f"{name} takes a{'n integer' if kind is int else ' number'}, "
                                 f"not '{value}'") from None
        if key == "n_predict":
            self.n_predict = number
        else:
            if key == "seed":
                number = None if number < 0 else number
            self.sampling = dataclasses.replace(self.sampling, **{key: number})
        return f"{key} = {self.n_predict if key == 'n_predict' else getattr(self.sampling, key)}"

    def settings(self) -> str:
        values = dataclasses.asdict(self.sampling) | {"n_predict": self.n_predict}
        return "  ".join(f"{k}={v}" for k, v in values.items())

    # -- /save and /load: the conversation as a JSON list of OpenAI messages ---------------
    def save(self, path: str) -> int:
        try:
            Path(path).expanduser().write_text(
                json.dumps(self.all_messages(), ensure_ascii=False, indent=2) + "\n",
                encoding="utf-8")
        except OSError as exc:
            raise EdgeInferError(f"cannot write {path}: {exc.strerror}") from None
        return len(self.all_messages())

    def load(self, path: str) -> int:
        try:
            loaded = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
        except OSError as exc:
            raise EdgeInferError(f"cannot read {path}: {exc.strerror}") from None
        except ValueError as exc:
            raise EdgeInferError(f"{path} is not JSON: {exc}") from None
        if not isinstance(loaded, list) or not all(
                isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                and isinstance(m.get("content"), str) for m in loaded):
            raise EdgeInferError(f"{path} is not a list of messages with a role (system, "
                                 "user, assistant) and a text content")
        system = [m["content"] for m in loaded if m["role"] == "system"]
        self.system = system[0] if system else None
        self.messages = [{"role": m["role"], "content": m["content"]}
                         for m in loaded if m["role"] != "system"]
        self.first = 0
        return len(loaded)
