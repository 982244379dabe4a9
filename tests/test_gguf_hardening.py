"""Regression tests for the GGUF cases of issue 32: each mutated file is refused with one
short printable line naming the key or tensor (never a traceback, a MemoryError or a flood),
file strings print as data, and a model that computes NaN fails cleanly in the sampler, the
CLI and the server."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import struct
import threading

import httpx
import numpy as np
import pytest
from gguf_fuzz import (
    FLOAT_TYPES,
    STRING,
    Array,
    check_cli,
    cli,
    error_line_problem,
    nested_array,
    read_layout,
    serialize,
)
from test_server_harness import ServerProcess
from tiny_models import write_tiny_model

from edgeinfer.errors import EdgeInferError

U32, U64, F32 = 4, 10, 6


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The layout of the standard tiny llama (tests/tiny_models.py)."""
    return read_layout(write_tiny_model(tmp_path_factory.mktemp("hard") / "tiny.gguf"))


@pytest.fixture
def write(tmp_path):
    def write(layout, name: str = "case.gguf", raw: bytes | None = None):
        path = tmp_path / name
        path.write_bytes(serialize(layout)[0] if raw is None else raw)
        return path
    return write


def info_text(path) -> str:
    """`edgeinfer info` in this process, as plain text 200 columns wide."""
    from edgeinfer.commands.info import info_command

    out = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "200"  # rich's Console reads it when info_command builds one
    try:
        with contextlib.redirect_stdout(out):
            info_command(str(path), 0)
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return out.getvalue()


def refusal(path) -> str:
    """The EdgeInferError `info` refuses the file with, checked to be one short line."""
    with pytest.raises(EdgeInferError) as caught:
        info_text(path)
    message = str(caught.value)
    assert error_line_problem(message) is None, message
    assert len(message) < 300, message
    return message


def with_kv(base, key, vtype, value):
    layout = base.copy()
    layout.set(key, vtype, value)
    return layout


# -- the file's structure ---------------------------------------------------------------------
@pytest.mark.parametrize("align", [0, 3, 48])
def test_alignment_not_a_power_of_two(base, write, align):
    message = refusal(write(with_kv(base, "general.alignment", U32, align)))
    assert f"general.alignment {align} is not a power of 2" in message


def test_alignment_of_another_type(base, write):
    message = refusal(write(with_kv(base, "general.alignment", U64, 32)))
    assert "'general.alignment' must be of type uint32" in message


@pytest.mark.parametrize("depth", [2, 5000, 100_000])
def test_nested_arrays_refused_without_recursion(base, write, depth):
    layout = base.copy()
    layout.find("tokenizer.ggml.tokens").value = nested_array(depth)
    assert "'tokenizer.ggml.tokens' is an array of arrays" in refusal(write(layout))


def _field(fields, label):
    return next(f for f in fields if f.label == label)


def test_changed_n_dims_gives_one_short_line(base, write):
    """Any tensor's n_dims rewritten: the reads after it go astray, and the error stays one
    short line (the issue saw 190 MB of stderr embedding a garbage tensor name; main made a
    1.2 MB line of this 1.3 MB file from blk.0.ffn_norm.weight's n_dims = 5)."""
    raw, fields = serialize(base)
    for f in (f for f in fields if f.label.endswith(".n_dims")):
        for n_dims in (0, 1, 2, 3, 5, 8, 2**32 - 1):
            bad = raw[: f.pos] + struct.pack("<I", n_dims) + raw[f.pos + 4:]
            if bad != raw:
                refusal(write(base, raw=bad))
    f = _field(fields, "tensor[blk.0.ffn_norm.weight].n_dims")
    path = write(base, raw=raw[: f.pos] + struct.pack("<I", 5) + raw[f.pos + 4:])
    out = check_cli(path, "info", timeout=120)
    assert out.status == "refused", out.detail


def test_long_garbage_tensor_name_is_cut(base, write):
    layout = base.copy()
    layout.tensor("output_norm.weight").name = "\x1b[2J" + "n" * 5000
    message = refusal(write(layout))
    assert "name is too long" in message and "\\x1b[2J" in message and "…" in message


def test_shifted_tensor_offset(base, write):
    """The issue's NaN logits from a tensor offset moved by one byte: refused at load."""
    layout = base.copy()
    layout.tensor("blk.0.attn_norm.weight").offset += 1
    message = refusal(write(layout))
    assert "tensor 'blk.0.attn_norm.weight' has offset" in message


def test_unknown_ggml_type_and_zero_dim(base, write):
    layout = base.copy()
    layout.tensor("output_norm.weight").ggml_type = 1000
    assert "unknown ggml type 1000" in refusal(write(layout))
    layout = base.copy()
    layout.tensor("output_norm.weight").dims = [0]
    assert "tensor 'output_norm.weight' dimension 0 is 0" in refusal(write(layout))


def test_lying_counts_and_truncations(base, write):
    raw, fields = serialize(base)
    for label, value in (("n_kv", 2**40), ("n_tensors", 2**63), ("kv[general.name].key.len",
                                                                  2**62)):
        f = _field(fields, label)
        bad = raw[: f.pos] + struct.pack(f.fmt, value) + raw[f.pos + struct.calcsize(f.fmt):]
        refusal(write(base, raw=bad))
    header_end = max(f.pos for f in fields)
    for cut in range(0, header_end + 64, 61):
        refusal(write(base, raw=raw[:cut]))


# -- hyperparameters --------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, 1, 2, 8])
def test_embedding_length(base, write, value):
    message = refusal(write(with_kv(base, "llama.embedding_length", U32, value)))
    assert "llama.embedding_length" in message or "token_embd.weight' has shape" in message


@pytest.mark.parametrize("key", ["llama.attention.head_count", "llama.attention.head_count_kv"])
def test_zero_head_counts(base, write, key):
    assert f"'{key}' is 0" in refusal(write(with_kv(base, key, U32, 0)))


def test_embedding_not_divisible_by_heads(base, write):
    layout = base.copy()
    layout.kvs = [kv for kv in layout.kvs if not kv.key.startswith(
        ("llama.attention.key_length", "llama.attention.value_length"))]
    layout.set("llama.attention.head_count", U32, 3)
    layout.set("llama.attention.head_count_kv", U32, 3)
    assert "not divisible by 'llama.attention.head_count' 3" in refusal(write(layout))


@pytest.mark.parametrize("value", [2_000_000_000, 600_000_000, 0, 513])
def test_block_count_out_of_range(base, write, value):
    assert "'llama.block_count' is" in refusal(write(with_kv(base, "llama.block_count", U32,
                                                             value)))


@pytest.mark.parametrize("value", [1, 3])
def test_block_count_not_matching_the_tensors(base, write, value):
    message = refusal(write(with_kv(base, "llama.block_count", U32, value)))
    assert f"'llama.block_count' is {value} but the tensors hold 2 blocks" in message


def test_block_count_zero_run_exits_non_zero(base, write):
    """The issue: `run` exited 0 printing blank lines."""
    path = write(with_kv(base, "llama.block_count", U32, 0))
    out = check_cli(path, "run", timeout=120)
    assert out.status == "refused" and "block_count" in out.detail, out.detail


def test_serve_refuses_with_one_line(base, write):
    path = write(with_kv(base, "llama.block_count", U32, 2_000_000_000))
    proc = cli("serve", path, "--port", "0", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert err.splitlines()[-1].startswith("error: invalid model: 'llama.block_count' is 2000")


@pytest.mark.parametrize("key, value", [
    ("llama.attention.layer_norm_rms_epsilon", -math.inf),
    ("llama.attention.layer_norm_rms_epsilon", math.nan),
    ("llama.attention.layer_norm_rms_epsilon", 0.0),
    ("llama.rope.freq_base", -10000.0),
    ("llama.rope.freq_base", math.inf),
    ("llama.rope.scaling.factor", -2.0),
])
def test_non_finite_or_negative_floats(base, write, key, value):
    """The issue's NaN logits from epsilon = -inf or a negative rope base: refused at load."""
    message = refusal(write(with_kv(base, key, F32, value)))
    assert f"'{key}' is" in message and "expected a finite number" in message


@pytest.mark.parametrize("key, vtype, value", [
    ("llama.context_length", STRING, "4096"),
    ("llama.block_count", FLOAT_TYPES[0], 2.0),
    ("llama.attention.head_count", 9, Array(U32, [4, 4, 4])),  # 3 values for 2 layers
    ("tokenizer.ggml.tokens", STRING, "abc"),
    ("tokenizer.ggml.model", U32, 3),
    ("general.architecture", 9, Array(STRING, ["llama"])),
])
def test_values_of_the_wrong_type(base, write, key, vtype, value):
    assert f"'{key}' is" in refusal(write(with_kv(base, key, vtype, value)))


def test_gemma_sliding_window_pattern_zero(tmp_path, write):
    layout = read_layout(write_tiny_model(tmp_path / "g.gguf", "gemma3"))
    layout.set("gemma3.attention.sliding_window_pattern", U32, 0)
    assert "'gemma3.attention.sliding_window_pattern' is 0" in refusal(write(layout))


# -- metadata is data, never markup -------------------------------------------------------------
MARKUP = "[/bad] [bold]x[/bold] [link=file:///etc]y"


def test_markup_in_name_and_template_prints_as_text(base, write):
    layout = with_kv(base, "general.name", STRING, MARKUP + " \x1b[31mred")
    layout.set("tokenizer.chat_template", STRING, MARKUP + "{{ messages }}")
    path = write(layout)
    text = info_text(path)
    assert text.count(MARKUP) == 2 and "\x1b" not in text and "\\x1b[31mred" in text
    proc = cli("info", path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().count(MARKUP) == 2


def test_markup_and_escapes_in_unsupported_names(base, write):
    layout = with_kv(base, "general.architecture", STRING, "[/bad]\x1b[2J")
    assert "'[/bad]\\x1b[2J'" in refusal(write(layout))


# -- NaN logits: the sampler, the CLI, the server -----------------------------------------------
def test_sampler_refuses_nan_and_inf_rows():
    from edgeinfer.errors import ModelFault
    from edgeinfer.sampling import SamplingParams, make_sampler

    for params in (SamplingParams(temperature=0), SamplingParams(seed=1),
                   SamplingParams(seed=1, top_k=0, top_p=1.0, min_p=0.0)):
        sampler = make_sampler(params)
        row = np.zeros(10, np.float32)
        for bad, word in ((np.nan, "NaN"), (np.inf, "infinite")):
            row[3] = bad
            with pytest.raises(ModelFault, match=f"the model produced {word} logits"):
                sampler.sample(row)
        row[:] = -np.inf  # every token masked: nothing to pick either
        with pytest.raises(ModelFault):
            sampler.sample(row)
        row[:5] = 0.0  # some masked (ignore_eos does so): fine
        assert sampler.sample(row) < 5


POISONED = 3 + ord("!")  # the id of "!" in the tiny vocabulary (3 specials, then the bytes)


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    """A valid tiny model whose input embedding of "!" is NaN (its Q8_0 scales; the output
    head is a separate tensor): a prompt holding "!" computes NaN logits, others are fine
    until they generate "!"."""
    from edgeinfer.gguf_file import GGUFFile

    path = write_tiny_model(tmp_path_factory.mktemp("nan") / "nan.gguf", tied=False)
    info = GGUFFile(path).tensors["token_embd.weight"]
    row_bytes = info.n_bytes // info.shape[0]
    data = bytearray(path.read_bytes())
    for block in range(row_bytes // 34):
        pos = info.offset + POISONED * row_bytes + block * 34
        data[pos: pos + 2] = np.array([np.nan], np.float16).tobytes()
    path.write_bytes(bytes(data))
    return path


def test_nan_logits_api_and_cli(poisoned, tmp_path):
    from edgeinfer.api import Model
    from edgeinfer.errors import ModelFault

    model = Model.load(poisoned, n_ctx=64)
    # a prompt that never reads the poisoned row decodes as the clean file does
    clean = Model.load(write_tiny_model(tmp_path / "clean.gguf", tied=False), n_ctx=64)
    expected = list(clean.generate("hello", max_tokens=3, temperature=0))
    assert expected and list(model.generate("hello", max_tokens=3, temperature=0)) == expected
    with pytest.raises(ModelFault, match="NaN logits"):
        list(model.generate("hi!", max_tokens=3, temperature=0))
    proc = cli("run", poisoned, "-p", "hi!", "--raw", "-n", "4", "-q", timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.decode().splitlines() == [
        "error: the model produced NaN logits (a corrupt or incompatible model file?)"]


@pytest.mark.slow
def test_nan_logits_fail_one_request_not_the_batch(poisoned):
    """The server answers the poisoned request with a JSON 500 and goes on serving the
    request batched with it, and the next ones."""
    srv = ServerProcess(poisoned, "-np", "2", "-c", "256")
    try:
        results = {}

        def post(name, prompt):
            body = {"prompt": prompt, "n_predict": 24, "temperature": 0, "cache_prompt": False}
            results[name] = httpx.post(srv.url + "/completion", json=body, timeout=120)

        threads = [threading.Thread(target=post, args=a) for a in (("bad", "hi!"),
                                                                  ("good", "hello there"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        bad, good = results["bad"], results["good"]
        assert bad.status_code == 500
        assert "the model produced NaN logits" in bad.json()["error"]["message"]
        assert good.status_code == 200, good.text
        stream = httpx.post(srv.url + "/completion", timeout=120, json={
            "prompt": "!", "stream": True, "n_predict": 4})
        events = [json.loads(line[6:]) for line in stream.text.splitlines()
                  if line.startswith("data: ")]
        assert "NaN logits" in events[-1]["error"]["message"]
        assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
        assert "Traceback" not in srv.log_text()
    finally:
        srv.stop()


@pytest.mark.real
def test_real_models_still_pass(real_model):
    """The checks refuse none of the real models."""
    from edgeinfer.validate import open_model

    for name in ("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"):
        _, _, config = open_model(real_model(name))
        assert config.n_layer > 0

