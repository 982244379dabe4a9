"""`edgeinfer chat` and `edgeinfer run` without a prompt in a real pseudo-terminal (pexpect):
the prompt_toolkit line editor, answers rendered by rich, the commands, multi-line input,
history with the up arrow, Ctrl-C stopping an answer and Ctrl-D leaving."""

from __future__ import annotations

import os
import re
import sys

import pytest
from tiny_models import write_tiny_model

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("prompt_toolkit", reason="the chat extra (prompt_toolkit)")
PROMPT = ">>>"  # prompt_toolkit draws the space as a cursor move
STATS = re.compile(r"prompt: (\d+) new tokens, (\d+) cached, [\d.]+ t/s \| answer: (\d+) tokens")
HANG_GUARD = 600  # seconds: only a hung child times out; a loaded machine's slow load does not


def spawn(*args, tmp_path):
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "100", "LINES": "40",
           "XDG_STATE_HOME": str(tmp_path),
           "PROMPT_TOOLKIT_NO_CPR": "1"}  # pexpect does not answer cursor position requests
    child = pexpect.spawn(sys.executable, ["-m", "edgeinfer.cli", *map(str, args)],
                          env=env, encoding="utf-8", timeout=HANG_GUARD, dimensions=(40, 100))
    child.expect_exact(PROMPT)
    return child


def ask(child, text: str) -> tuple[int, int]:
    """Send a message; wait for the answer's timings line and the next prompt."""
    child.sendline(text)
    child.expect(STATS)
    stats = int(child.match.group(1)), int(child.match.group(2))
    child.expect_exact(PROMPT)
    return stats


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("pty") / "tiny.gguf")


def test_run_without_a_prompt_on_a_terminal_is_a_chat(tiny, tmp_path):
    child = spawn("run", tiny, "--local", "-n", "4", "--temp", "0", "-c", "512",
                  tmp_path=tmp_path)
    new1, cached1 = ask(child, "hello")
    new2, cached2 = ask(child, "again")
    assert cached1 == 0 and cached2 >= new1  # the second turn reuses the first
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_commands_multiline_and_history(tiny, tmp_path):
    saved = tmp_path / "c.json"
    child = spawn("chat", tiny, "--local", "-n", "3", "--temp", "0", "-c", "512",
                  tmp_path=tmp_path)
    child.sendline("/help")
    child.expect_exact("/save FILE")
    child.expect_exact(PROMPT)
    child.sendline("/set temp 0.3")
    child.expect_exact("temperature = 0.3")
    child.sendline("/system be brief")
    child.expect_exact("system prompt set")
    child.sendline('"""first line')
    child.expect_exact("...")
    child.sendline('second line"""')
    child.expect(STATS)
    child.expect_exact(PROMPT)
    child.sendline("/stats")
    child.expect(r"context: \d+ of 512 tokens; 2 messages")
    child.sendline(f"/save {saved}")
    child.expect_exact("saved 3 messages")
    child.sendline("/clear")
    child.expect_exact("conversation cleared")
    child.sendline(f"/load {saved}")
    child.expect_exact("loaded 3 messages")
    child.sendline("/bogus")
    child.expect_exact("unknown command /bogus")
    child.expect_exact(PROMPT)
    child.send("\x1b[A\x1b[A")  # up twice: /load's line back from the history
    child.expect_exact(f"/load {saved}")
    child.send("\r")
    child.expect_exact("loaded 3 messages")
    child.expect_exact(PROMPT)
    child.sendintr()  # Ctrl-C at the prompt does not leave
    child.expect_exact("Ctrl-D or /bye")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    import json

    messages = json.loads(saved.read_text())
    assert messages[0] == {"role": "system", "content": "be brief"}
    assert messages[1] == {"role": "user", "content": "first line\nsecond line"}


@pytest.mark.real
def test_ctrl_c_stops_an_answer_and_the_next_turn_reuses_the_cache(real_model, tmp_path):
    """Greedy SmolLM2 answers this question with numbers until the context is full (about
    2,000 tokens; it ends no sooner), so Ctrl-C sent at the answer's 12th number finds
    about 1,970 tokens still to come."""
    model = real_model("SmolLM2-135M-Instruct.Q4_1.gguf")
    child = spawn("chat", model, "--local", "--temp", "0", "-c", "2048", "-t", "2",
                  tmp_path=tmp_path)
    child.sendline("Write the numbers from 1 to 1000, separated by spaces.")
    child.expect(r"\b12\b")  # the answer is streaming
    child.sendintr()
    stopped = child.expect_exact(["answer stopped", "Ctrl-D or /bye"])
    assert stopped == 0, "the answer ended before Ctrl-C"
    child.expect(STATS)
    asked = int(child.match.group(1))  # the question's prompt tokens
    assert int(child.match.group(3)) < 2048 - asked  # stopped before the context was full
    child.expect_exact(PROMPT)
    new, cached = ask(child, "Thanks.")
    assert cached > asked and new < 40  # the stopped answer stays cached; only the new turn
    child.sendline("/bye")
    child.expect(pexpect.EOF)


def test_answers_to_a_file_prompts_on_the_terminal(tiny, tmp_path):
    """`edgeinfer chat > answers.txt` on a terminal: the prompt and the editor stay on the
    terminal (stderr), the file gets only the answers."""
    out = tmp_path / "answers.txt"
    env = {**os.environ, "TERM": "xterm", "XDG_STATE_HOME": str(tmp_path),
           "PROMPT_TOOLKIT_NO_CPR": "1"}
    cmd = (f"{sys.executable} -m edgeinfer.cli chat {tiny} --local -n 4 --temp 0 -c 512 "
           f"> {out}")
    child = pexpect.spawn("/bin/sh", ["-c", cmd], env=env, encoding="utf-8", timeout=90,
                          dimensions=(40, 100))
    child.expect_exact(PROMPT)
    child.sendline("hello")
    child.expect(STATS)
    child.expect_exact(PROMPT)
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    text = out.read_text()
    assert text.strip() and text.endswith("\n\n")  # one plain answer, a blank line after
    assert ">>>" not in text and "\x1b" not in text and "prompt:" not in text
