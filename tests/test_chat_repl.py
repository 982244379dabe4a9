"""`edgeinfer chat` without a terminal (commands/chat/): turns read from stdin, answers on
stdout, the cache kept between turns (the same answers as a fresh conversation), the
context shift, the commands, and the conversation's JSON; the same through a server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_server_harness import ServerProcess
from tiny_models import write_tiny_model

from edgeinfer.commands.chat.session import Conversation
from edgeinfer.errors import EdgeInferError

STATS = "prompt: "


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("chat") / "tiny.gguf")


def chat(model, lines, *args, env=None):
    done = subprocess.run(
        [sys.executable, "-m", "edgeinfer.cli", "chat", str(model), "--temp", "0",
         *map(str, args)], input="".join(line + "\n" for line in lines),
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return done


def answers(done) -> list[str]:
    """The answers on stdout, each ended by a blank line."""
    return done.stdout.split("\n\n")[:-1]


def turn_stats(done) -> list[tuple[int, int]]:
    """(new prompt tokens, cached) per turn, from the timings lines."""
    out = []
    for line in done.stderr.splitlines():
        if line.startswith(STATS):
            words = line.split()
            out.append((int(words[1]), int(words[4])))
    return out


def test_turns_reuse_the_cache_and_answer_as_a_fresh_conversation(tiny, tmp_path):
    saved = tmp_path / "conv.json"
    done = chat(tiny, ["hello there", "and then?", f"/save {saved}"], "-n", "5", "--local",
                "-c", "512")
    first, second = answers(done)
    (new1, cached1), (new2, cached2) = turn_stats(done)
    assert cached1 == 0 and cached2 > new1  # the first turn (prompt and answer) is reused
    messages = json.loads(saved.read_text())
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2
    assert [m["content"] for m in messages[1::2]] == [first, second]
    # the same conversation loaded into a new chat, the second question asked again
    resaved = tmp_path / "first.json"
    resaved.write_text(json.dumps(messages[:2]))
    again = chat(tiny, [f"/load {resaved}", "and then?"], "-n", "5", "--local", "-c", "512")
    assert answers(again) == [second]
    assert turn_stats(again) == [(cached2 + new2, 0)]  # all of it processed, nothing cached


def test_commands(tiny, tmp_path):
    done = chat(tiny, ["/help", "/set temp 0.5", "/set parameter top_k 7", "/set",
                       "/set seed x", "/set bogus 1", "/system be brief", "/system",
                       "/set system be terse", "/system", "/stats", "/clear", "/load /nope",
                       "/save", "/what", "/bye", "never read"], "--local", "-c", "256")
    err = done.stderr
    assert "/system TEXT" in err and "/bye" in err  # /help
    assert "temperature = 0.5" in err and "top_k = 7" in err
    assert "temperature=0.5  top_k=7" in err  # /set alone
    assert "error: seed takes an integer, not 'x'" in err
    assert "error: unknown setting 'bogus'" in err
    assert "\nbe brief\n" in err and "\nbe terse\n" in err
    assert "error: cannot read /nope" in err and "error: usage: /save FILE" in err
    assert "error: unknown command /what" in err
    assert done.stdout == ""  # commands answer on stderr; no turn was taken


def test_the_context_shifts_out_the_oldest_turns(tiny, tmp_path):
    saved = tmp_path / "all.json"
    lines = ["/system keep me", *(f"question number {i} " * 6 for i in range(6)),
             "/stats", f"/save {saved}"]
    done = chat(tiny, lines, "-n", "8", "--local", "-c", "160")
    assert "(context full: the oldest 2 messages left the context)" in done.stderr
    assert len(answers(done)) == 6
    shifted = int(done.stderr.split(" shifted out")[0].rsplit(" ", 1)[1])
    assert shifted >= 2 and shifted % 2 == 0
    # the whole conversation is saved, the system prompt first
    messages = json.loads(saved.read_text())
    assert messages[0] == {"role": "system", "content": "keep me"} and len(messages) == 13


def test_a_message_longer_than_the_context_is_an_error_not_a_crash(tiny):
    done = chat(tiny, ["word " * 400, "short one"], "-n", "4", "--local", "-c", "128")
    assert "error: the message does not fit the context" in done.stderr
    assert len(answers(done)) == 1  # the next message is answered


def test_through_a_server_the_same_answers(tiny):
    srv = ServerProcess(tiny, "-np", "1", "-c", "512")
    try:
        lines = ["hello there", "and then?"]
        remote = chat(tiny, lines, "-n", "5", "--host", srv.url)
        local = chat(tiny, lines, "-n", "5", "--local", "-c", "512")
    finally:
        srv.stop()
    assert answers(remote) == answers(local) and len(answers(remote)) == 2
    assert "loading" not in remote.stderr
    (_, cached1), (_, cached2) = turn_stats(remote)
    assert cached1 == 0 and cached2 > 0  # the server's slot kept the first turn


def test_conversation_settings_and_shift():
    conv = Conversation(system="s")
    assert conv.set("temp", "0.2") == "temperature = 0.2"
    assert conv.set("n", "12") == "n_predict = 12" and conv.n_predict == 12
    assert conv.set("seed", "-1") == "seed = None"
    with pytest.raises(EdgeInferError, match="repeat_penalty must be > 0"):
        conv.set("repeat_penalty", "0")
    conv.messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                     {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"},
                     {"role": "user", "content": "e"}]
    assert conv.drop_oldest() == 2 and conv.context()[0] == {"role": "system", "content": "s"}
    assert [m["content"] for m in conv.context()[1:]] == ["c", "d", "e"]
    assert conv.drop_oldest() == 2 and conv.drop_oldest() == 0
    assert len(conv.all_messages()) == 6  # nothing is lost from the conversation itself


def test_finished_markdown_blocks_are_cut_outside_code_fences():
    from edgeinfer.commands.chat.repl import stable_end

    text = "para one\n\n```py\nx = 1\n\ny = 2\n```\n\nnext"
    assert text[:stable_end(text, 0)] == "para one\n\n```py\nx = 1\n\ny = 2\n```\n\n"
    open_fence = "intro\n\n```\ncode\n\nmore"
    assert open_fence[:stable_end(open_fence, 0)] == "intro\n\n"
    assert stable_end("no blank line yet", 0) == 0
    assert stable_end("a\n\nb\n\nc", 3) == len("a\n\nb\n\n")
