"""The CLI as a user runs it: a subprocess, with pipes, exit codes and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from gguf import GGMLQuantizationType as Q
from test_server_harness import ServerProcess
from tiny_models import write_tiny_model

from edgeinfer.api import Model


def edgeinfer(*args, stdin: str | None = None, timeout: float = 300):
    """Run the CLI; stdout/stderr decoded without newline translation (the model's text may
    hold a bare \r)."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    out = subprocess.run([sys.executable, "-m", "edgeinfer.cli", *map(str, args)],
                         input=None if stdin is None else stdin.encode(), capture_output=True,
                         timeout=timeout, env=env)
    out.stdout, out.stderr = out.stdout.decode(), out.stderr.decode()
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("cli") / "tiny.gguf", "llama", Q.Q8_0)


def expected_text(path, prompt: str, n: int) -> str:
    model = Model.load(path, n_ctx=256)
    return "".join(model.generate(prompt, max_tokens=n, temperature=0))


def test_help_is_fast_and_does_not_import_numba():
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "edgeinfer.cli", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "run" in out.stdout and "serve" in out.stdout
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines()}
    assert "numba" not in imported


def test_run_prompt_stdout_is_only_the_text(tiny):
    want = expected_text(tiny, "the cat", 12)
    out = edgeinfer("run", tiny, "-p", "the cat", "-n", 12, "--temp", 0, "--raw", "-c", 256)
    assert out.returncode == 0, out.stderr
    assert out.stdout == want
    assert "eval time" in out.stderr


def test_run_reads_stdin_and_file(tiny, tmp_path):
    want = expected_text(tiny, "the cat", 8)
    piped = edgeinfer("run", tiny, "-n", 8, "--temp", 0, "--raw", "-q", stdin="the cat")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == want and piped.stderr == ""
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("the cat")
    from_file = edgeinfer("run", tiny, "-f", prompt_file, "-n", 8, "--temp", 0, "--raw", "-q")
    assert from_file.stdout == want


def test_run_same_seed_same_text(tiny):
    args = ("run", tiny, "-p", "in the", "-n", 16, "--temp", 1.0, "--seed", 7, "-q", "--raw")
    first, second = edgeinfer(*args), edgeinfer(*args)
    assert first.returncode == 0 and first.stdout == second.stdout


def test_chat_template_applied_by_default(tiny):
    model = Model.load(tiny, n_ctx=256)
    chat = model.apply_chat_template([{"role": "user", "content": "hi"}])
    want = "".join(model.generate(chat, max_tokens=6, temperature=0))
    out = edgeinfer("run", tiny, "-p", "hi", "-n", 6, "--temp", 0, "-q")
    assert out.stdout == want


def test_info(tiny):
    out = edgeinfer("info", tiny, "-c", 128)
    assert out.returncode == 0
    assert "llama" in out.stdout and "Q8_0" in out.stdout and "KV cache" in out.stdout


def bad_files(tmp_path, tiny):
    data = tiny.read_bytes()
    cases = {
        "missing": (tmp_path / "nope.gguf", "no such model file"),
        "magic": (tmp_path / "magic.gguf", "bad magic"),
        "truncated": (tmp_path / "trunc.gguf", "truncated"),
        "version": (tmp_path / "version.gguf", "unsupported GGUF version 1"),
        "arch": (tmp_path / "arch.gguf", "unsupported architecture 'llamx'"),
        "quant": (write_tiny_model(tmp_path / "iq.gguf", "llama", Q.IQ2_XXS),
                  "tensor 'blk.0.attn_q.weight' has unsupported quant type IQ2_XXS"),
    }
    cases["magic"][0].write_bytes(b"NOPE" + data[4:])
    cases["truncated"][0].write_bytes(data[: len(data) // 2])
    cases["version"][0].write_bytes(data[:4] + (1).to_bytes(4, "little") + data[8:])
    cases["arch"][0].write_bytes(data.replace(b"llama", b"llamx"))
    return cases


@pytest.mark.parametrize("kind", ["missing", "magic", "truncated", "version", "arch", "quant"])
def test_bad_model_files_fail_with_one_line(tiny, tmp_path, kind):
    path, message = bad_files(tmp_path, tiny)[kind]
    out = edgeinfer("run", path, "-p", "hi", "-n", 2)
    assert out.returncode == 1
    assert out.stdout == ""
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], out.stderr


def test_prompt_longer_than_context(tiny):
    out = edgeinfer("run", tiny, "-p", "the cat " * 100, "-c", 32, "--raw", "-n", 4)
    assert out.returncode == 1 and "context size" in out.stderr
    assert "Traceback" not in out.stderr


def test_wrong_flag_is_a_usage_error(tiny):
    out = edgeinfer("run", tiny, "--no-such-flag")
    assert out.returncode == 2 and "Traceback" not in out.stderr


def test_prompt_that_is_not_utf8_is_one_line_error(tiny, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ab\xffcd")
    from_file = edgeinfer("run", tiny, "-f", bad, "-n", 2)
    piped = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "run", str(tiny), "-n", "2"],
                           input=b"ab\xffcd", capture_output=True, timeout=300)
    for out in (from_file, piped):
        stderr = out.stderr if isinstance(out.stderr, str) else out.stderr.decode()
        assert out.returncode == 1 and "Traceback" not in stderr, stderr
        assert "not valid UTF-8" in stderr and len(stderr.strip().splitlines()) == 1


def test_empty_prompt_is_an_error(tiny):
    out = edgeinfer("run", tiny, "-n", 2, stdin="")
    assert out.returncode == 1 and "empty prompt" in out.stderr


@pytest.mark.real
def test_run_without_model_uses_the_default(real_model):
    real_model("SmolLM2-135M-Instruct.Q4_1.gguf")  # pulled by .ci/run; skip otherwise
    out = edgeinfer("run", "-p", "The capital of France is", "--raw", "-n", 4, "--temp", 0,
                    "-q")
    assert out.returncode == 0, out.stderr
    golden = Path(__file__).resolve().parents[2] / "shared" / "golden" / "smollm2.json"
    case = json.loads(golden.read_text())["greedy"][0]  # llama.cpp's greedy continuation
    assert case["prompt"] == "The capital of France is"
    assert out.stdout and case["text"].startswith(out.stdout)


@pytest.mark.parametrize("flash", ["off", "on"])
def test_bench_json_rows_have_llama_bench_fields(tiny, flash):
    out = edgeinfer("bench", tiny, "-p", 24, "-n", 4, "-r", 2, "-d", 40, "-t", 1, "--json",
                    "-fa", flash)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in rows] == [(24, 0, 40), (0, 4, 40)]
    for r in rows:
        assert r["flash_attn"] is (flash == "on")
        assert r["n_threads"] == 1 and r["model_filename"] == str(tiny)
        assert len(r["samples_ts"]) == 2 and all(ts > 0 for ts in r["samples_ts"])
        assert r["avg_ts"] == pytest.approx(sum(r["samples_ts"]) / 2)
        assert r["stddev_ts"] >= 0 and r["peak_rss_mb"] > 0


def test_bench_table_and_bad_depth(tiny):
    out = edgeinfer("bench", tiny, "-p", 16, "-n", 2, "-r", 1, "-d", 8)
    assert out.returncode == 0, out.stderr
    assert "pp16 @ d8" in out.stdout and "tg2 @ d8" in out.stdout
    bad = edgeinfer("bench", tiny, "-p", 16, "-n", 2, "-d", 600, "-c", 256)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "too small" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    bad_flag = edgeinfer("bench", tiny, "-fa", "maybe")
    assert bad_flag.returncode == 2 and "Traceback" not in bad_flag.stderr
    assert "maybe" in bad_flag.stderr


def test_serve_on_port_zero_names_the_port_it_got(tiny):
    """`edgeinfer serve --port 0`: the system picks a free port, the 'listening on' line on
    stderr names it, and the server answers there."""
    srv = ServerProcess(tiny, "-np", "1", "-c", "128", entry=("edgeinfer.cli", "serve"))
    try:
        assert srv.port > 0
        assert f"listening on http://127.0.0.1:{srv.port} " in srv.log_text()
        assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
    finally:
        srv.stop()


# -- structured output (issue 34) --------------------------------------------------------------
FLAG = {"type": "object", "properties": {"flag": {"type": "boolean"}}, "required": ["flag"],
        "additionalProperties": False}


def test_run_json_schema_and_grammar(tiny, tmp_path):
    pytest.importorskip("llguidance", reason="the 'structured' extra")
    import jsonschema

    out = edgeinfer("run", tiny, "-p", "the cat", "--temp", 0, "--raw", "-c", 256, "-q",
                    "-j", json.dumps(FLAG))
    assert out.returncode == 0, out.stderr
    jsonschema.validate(json.loads(out.stdout), FLAG)
    grammar = tmp_path / "yn.gbnf"
    grammar.write_text('root ::= ("yes" | "no") "!"')
    out = edgeinfer("run", tiny, "-p", "the cat", "--temp", 0.9, "--raw", "-c", 256, "-q",
                    "--grammar-file", grammar)
    assert out.returncode == 0 and out.stdout in ("yes!", "no!"), out.stderr
    # the API: the same constraint, the same greedy text
    model = Model.load(tiny, n_ctx=256)
    text = "".join(model.generate("the cat", max_tokens=-1, temperature=0,
                                  json_schema=FLAG))
    assert json.loads(text) == json.loads(edgeinfer(
        "run", tiny, "-p", "the cat", "--temp", 0, "--raw", "-c", 256, "-q", "-j",
        json.dumps(FLAG)).stdout)


@pytest.mark.parametrize("args,message", [
    (["--grammar", "root ::= foo"], "Rule 'foo' not found"),
    (["-j", "{not json"], "not valid JSON"),
    (["--grammar", "root ::= \"a\"", "--grammar-file", "x.gbnf"], "not both"),
    (["--grammar", "root ::= \"a\"", "-j", "{}"], "not both"),
])
def test_run_bad_constraints_are_one_line_errors(tiny, args, message):
    pytest.importorskip("llguidance", reason="the 'structured' extra")
    out = edgeinfer("run", tiny, "-p", "x", "--raw", "-c", 256, *args)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
