"""`edgeinfer chat` (and `run` without a prompt on a terminal), as `ollama run`: a prompt,
an answer streamed as markdown, the next turn reusing the cache. Answers go to stdout (plain
text when it is not a terminal); everything else to stderr."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

from edgeinfer.commands.chat.backends import LocalChat, RemoteChat
from edgeinfer.commands.chat.session import ContextFull, Conversation
from edgeinfer.errors import EdgeInferError

HELP = """\
Commands:
  /system TEXT     set the system prompt (/system alone shows it)
  /set NAME VALUE  a sampling setting: temp, top_k, top_p, min_p, repeat_penalty,
                   repeat_last_n, presence_penalty, frequency_penalty, seed, n_predict
                   (/set alone shows them)
  /clear           forget the conversation (the system prompt stays)
  /save FILE       write the conversation as JSON (OpenAI messages)
  /load FILE       read one
  /stats           the last turn's tokens (new and cached) and speeds
  /help            this list
  /bye             leave (or Ctrl-D)
Ctrl-C stops an answer. Between lines of three double quotes (\"\"\"), a message spans lines."""


def info(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def history_path() -> Path:
    root = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    path = root / "edgeinfer" / "chat_history"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


class Reader:
    """The user's lines: prompt_toolkit (history, arrow keys) on a terminal when installed
    (the `chat` extra), else input() with readline; stdin's lines when it is not a tty."""

    def __init__(self, interactive: bool):
        self.interactive, self.session = interactive, None
        if not interactive:
            return
        try:
            from prompt_toolkit import PromptSession
            from prompt_toolkit.history import FileHistory
            from prompt_toolkit.output import create_output

            # the prompt on the terminal even when stdout goes to a file: stdout is answers
            out = None if sys.stdout.isatty() else create_output(stdout=sys.stderr)
            self.session = PromptSession(history=FileHistory(str(history_path())), output=out)
        except (ImportError, OSError):
            try:
                import readline  # noqa: F401  (history and line editing for input())
            except ImportError:
                pass

    def line(self, prompt: str) -> str:
        """One line; EOFError at Ctrl-D or the end of stdin, KeyboardInterrupt at Ctrl-C."""
        if self.session is not None:
            return self.session.prompt(prompt)
        if self.interactive:
            sys.stderr.write(prompt)  # not input(prompt): that writes it to stdout
            sys.stderr.flush()
            return input()
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    def message(self) -> str:
        """A message: one line, or the lines between \"\"\" and \"\"\" (Ollama's)."""
        first = self.line(">>> ")
        if not first.lstrip().startswith('"""'):
            return first
        rest = first.lstrip()[3:]
        if rest.rstrip().endswith('"""'):
            return rest.rstrip()[:-3]
        lines = [rest] if rest else []
        while True:
            line = self.line("... ")
            if line.rstrip().endswith('"""'):
                lines.append(line.rstrip()[:-3])
                return "\n".join(lines).strip("\n")
            lines.append(line)


class Printer:
    """Streams an answer to stdout: rich markdown on a terminal, plain text elsewhere."""

    def __init__(self, markdown: bool):
        self.console = None
        if markdown:
            from rich.console import Console

            self.console = Console(highlight=False)

    def answer(self, pieces: Iterator[str], shown: list[str]) -> None:
        """Print the pieces as they come, appending each to `shown` (kept on Ctrl-C)."""
        if self.console is None:
            for piece in pieces:
                shown.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n\n" if shown else "\n")
            sys.stdout.flush()
            return
        from rich.live import Live
        from rich.markdown import Markdown

        done = 0  # shown[:done] joined is printed for good; the rest is redrawn live

        class Tail:  # rendered at each refresh, not at each token
            def __rich__(self):
                return Markdown("".join(shown)[done:])

        with Live(Tail(), console=self.console, refresh_per_second=12,
                  vertical_overflow="visible") as live:
            for piece in pieces:
                shown.append(piece)
                if "\n\n" in piece or piece.endswith("\n"):
                    text = "".join(shown)
                    cut = stable_end(text, done)
                    if cut > done:  # whole blocks: print them once, above the live tail
                        live.console.print(Markdown(text[done:cut]))
                        done = cut
        self.console.print()


def stable_end(text: str, start: int) -> int:
    """Where the markdown of text[start:] can be cut for good: after its last blank line
    outside a code fence (the blocks before it no longer change as tokens arrive)."""
    cut, fenced, pos = start, False, start
    for line in text[start:].splitlines(keepends=True):
        pos += len(line)
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and not line.strip() and pos < len(text):
            cut = pos
    return cut


def open_backend(opts):
    """A running server when there is one (unless --local), else the model loaded here."""
    if not opts.local:
        from edgeinfer.commands.remote import _model_field, find_server

        base = find_server(opts.host, opts.model)
        if base is not None:
            return RemoteChat(base, _model_field(opts))
    from edgeinfer.commands.run import load_model

    return LocalChat(load_model(opts))


def chat_command(opts) -> None:
    conv = Conversation(system=opts.system, sampling=opts.sampling, n_predict=opts.n_predict)
    backend = open_backend(opts)
    interactive = sys.stdin.isatty()
    reader, printer = Reader(interactive), Printer(markdown=sys.stdout.isatty())
    if interactive and not opts.quiet:
        info(f"chatting with {backend.name}: /help for commands, Ctrl-D or /bye to leave")
    while True:
        try:
            text = reader.message()
        except KeyboardInterrupt:
            info("Use Ctrl-D or /bye to leave.")
            continue
        except EOFError:
            return
        if not text.strip():
            continue
        if text.startswith("/"):
            try:
                if command(text, conv, backend):
                    return
            except EdgeInferError as exc:
                info(f"error: {exc}")
            continue
        conv.messages.append({"role": "user", "content": text})
        turn(backend, conv, printer, opts.quiet)


def turn(backend, conv: Conversation, printer: Printer, quiet: bool) -> None:
    """One answer; the context shifts (oldest turns out, the system prompt kept) as needed."""
    shown: list[str] = []
    while True:
        try:
            printer.answer(backend.reply(conv), shown)
            break
        except ContextFull as exc:
            dropped = conv.drop_oldest()
            if not dropped:
                conv.messages.pop()
                info(f"error: the message does not fit the context: {exc}")
                return
            info(f"(context full: the oldest {dropped} messages left the context)")
        except KeyboardInterrupt:
            sys.stdout.write("\n")
            info("^C (answer stopped)")
            break
        except EdgeInferError as exc:
            conv.messages.pop()
            info(f"error: {exc}")
            return
    if shown:
        conv.messages.append({"role": "assistant", "content": "".join(shown)})
    else:
        conv.messages.pop()  # nothing answered: the question is not part of the conversation
    if not quiet:
        info(backend.last.line())


def command(text: str, conv: Conversation, backend) -> bool:
    """Run a /command; True to leave."""
    name, _, arg = text.partition(" ")
    arg = arg.strip()
    if name in ("/bye", "/exit", "/quit"):
        return True
    if name in ("/help", "/?"):
        info(HELP)
    elif name == "/system":
        if arg:
            conv.system = arg
            info("system prompt set")
        else:
            info(conv.system or "(no system prompt)")
    elif name == "/clear":
        conv.clear()
        info("conversation cleared")
    elif name in ("/save", "/load"):
        if not arg:
            raise EdgeInferError(f"usage: {name} FILE")
        if name == "/save":
            info(f"saved {conv.save(arg)} messages to {arg}")
        else:
            info(f"loaded {conv.load(arg)} messages from {arg}")
    elif name == "/set":
        words = arg.split()
        if words[:1] == ["system"]:  # Ollama's /set system TEXT
            return command("/system " + arg[len("system"):].strip(), conv, backend)
        words = words[1:] if words[:1] == ["parameter"] else words  # Ollama's spelling
        if not words:
            info(conv.settings())
        elif len(words) != 2:
            raise EdgeInferError("usage: /set NAME VALUE")
        else:
            info(conv.set(*words))
    elif name == "/stats":
        last = backend.last
        used = last.timings.cache_n + last.timings.prompt_n + last.timings.predicted_n
        info(last.line())
        info(f"context: {used} of {last.n_ctx or '?'} tokens; {len(conv.messages)} messages, "
             f"{conv.first} shifted out")
    else:
        raise EdgeInferError(f"unknown command {name}; /help lists them")
    return False
