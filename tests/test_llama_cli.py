"""edgeinfer-server: llama-server's command line translated to `edgeinfer serve`'s (no model)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgeinfer.server import llama_cli
from edgeinfer.server.llama_cli import FLAGS, UsageError, parse, translate
from edgeinfer.server.options import build_parser, settings_from_args

# Every flag llama.cpp's server tests pass (tools/server/tests/utils.py, ServerProcess.start,
# llama-cpp-python 0.3.36), with a value where it takes one.
SUITE_FLAGS = [
    "--port 8080", "--temp 0.8", "--seed 42", "--host 127.0.0.1", "--offline", "--model m.gguf",
    "--model-url u", "--model-draft d.gguf", "--hf-repo r", "--hf-file f", "--models-dir d",
    "--models-max 2", "--models-preset p.ini", "--cors-origins localhost", "--batch-size 32",
    "--ubatch-size 32", "--threads 2", "--n-gpu-layers 99", "--cont-batching", "--embedding",
    "--reranking", "--metrics", "--kv-unified", "--swa-full", "--slots", "--no-slots",
    "--pooling mean", "--alias a", "--tags t", "--ctx-size 512", "--parallel 2", "-ctk q8_0",
    "-ctv q8_0", "-fa on", "--n-predict 64", "--slot-save-path p", "--grp-attn-n 2",
    "--grp-attn-w 16", "--verbose", "--lora l.gguf", "--context-shift", "--spec-type ngram",
    "--api-key k", "--spec-draft-n-max 8", "--spec-draft-n-min 1", "--spec-synth-len 0.5",
    "--spec-synth-rates 0.1,0.2", "--no-ui", "--no-models-autoload", "--jinja", "--no-jinja",
    "--reasoning-format deepseek", "--reasoning on", "--chat-template chatml",
    "--chat-template-file t.jinja", "--mmproj-url u", "--no-mmproj", "--media-path p",
    "--sleep-idle-seconds 1", "--cache-ram 0", "--no-cache-idle-slots", "--ui-mcp-proxy",
    "--tools all", "--tools-runtime r", "--mcp-servers-config c", "--mcp-servers-json {}",
    "--backend_sampling",
]

# The command line of the suite's default preset (tinyllama2) pointed at a local file.
PRESET = ("--port 8080 --temp 0.8 --seed 42 --host 127.0.0.1 --offline --model m.gguf "
          "--batch-size 32 --no-slots --alias tinyllama-2 --ctx-size 512 --parallel 2 "
          "--n-predict 64 --no-jinja").split()


@pytest.mark.parametrize("flag", SUITE_FLAGS)
def test_every_flag_of_the_suite_is_read(flag):
    [(_, name, value)] = parse(flag.split())
    assert name == flag.split()[0].replace("_", "-")
    assert value == (flag.split()[1] if " " in flag else None)


def test_the_suite_preset_translates():
    out = translate(PRESET)
    assert out.serve_args == ["m.gguf", "--port", "8080", "--temp", "0.8", "--seed", "42",
                              "--host", "127.0.0.1", "--batch-size", "32", "--no-slots",
                              "--alias", "tinyllama-2", "--ctx-size", "512",
                              "--kv-unified-per-slot", "256", "--parallel", "2",
                              "--n-predict", "64", "--no-jinja"]
    assert out.unsupported == []


@pytest.mark.parametrize("args,n_ctx,per_slot", [
    ("-c 512 -np 2", "512", "256"),  # split across the slots
    ("-c 256 -np 2", "512", "256"),  # 128 each, rounded up to 256 as llama-context.cpp does
    ("-c 1000", "1024", None),  # -np auto: a unified KV cache, every slot sees all of it
    ("-c 512 -np 4 -kvu", "512", None),
    ("-c 0 -np 2", "0", None),  # the model's context
])
def test_ctx_size_is_llama_servers_kv_size(args, n_ctx, per_slot):
    serve_args = translate(["-m", "m.gguf", *args.split()]).serve_args
    assert serve_args[serve_args.index("--ctx-size") + 1] == n_ctx
    if per_slot is None:
        assert "--kv-unified-per-slot" not in serve_args
    else:
        assert serve_args[serve_args.index("--kv-unified-per-slot") + 1] == per_slot


@pytest.mark.parametrize("value,word", [("on", "on"), ("1", "on"), ("enabled", "on"),
                                        ("off", "off"), ("false", "off"), ("auto", "auto"),
                                        ("-1", "auto")])
def test_flash_attn_synonyms(value, word):
    assert translate(["-m", "m.gguf", "-fa", value]).serve_args[1:] == ["--flash-attn", word]


def test_lists_are_passed_whole():
    out = translate(["-m", "m.gguf", "--host", "127.0.0.1,::1", "-a", "x,y"])
    assert out.serve_args[1:] == ["--host", "127.0.0.1,::1", "--alias", "x,y"]
    assert out.unsupported == []


def test_llama_server_defaults_are_not_forwarded():
    out = translate(["-m", "m.gguf", "-t", "-1", "--cache-ram", "-1"])
    assert out.serve_args == ["m.gguf"]
    assert out.unsupported == ["--cache-ram -1 (no limit)"]


def test_spellings():
    assert translate(["--model=m.gguf", "--ctx_size=512", "--flash_attn", "off",
                      "--cont_batching"]).serve_args == ["m.gguf", "--ctx-size", "512",
                                                         "--flash-attn", "off"]


def test_already_so_flags_are_silent_and_each_unsupported_flag_is_named_once():
    out = translate(["-m", "m.gguf", "--offline", "-cb", "--slots", "-ub", "1",
                     "--ubatch-size", "2", "--lora", "x"])
    assert out.unsupported == ["-ub", "--ubatch-size", "--lora"]


def test_no_model_is_router_mode_over_the_pulled_models():
    from edgeinfer.pull import models_dir

    assert translate(["--port", "8080"]).serve_args[:2] == ["--models-dir", str(models_dir())]
    out = translate(["--models-dir", "/m", "--models-max", "2"])
    assert out.serve_args == ["--models-dir", "/m", "--models-max", "2"]


def test_gpu_layers_pass_through():
    out = translate(["-m", "m.gguf", "-ngl", "99"])
    assert out.unsupported == []
    assert out.serve_args[-2:] == ["--gpu-layers", "99"]


@pytest.mark.parametrize("argv,message", [
    (["-m", "m.gguf", "--no-such-flag"], "unknown argument: --no-such-flag"),
    (["-m", "m.gguf", "--port"], "--port needs a value"),
    (["-m", "m.gguf", "--metrics=1"], "--metrics takes no value"),
    (["-m", "m.gguf", "--port", "x"], "--port takes an integer"),
    (["-m", "m.gguf", "-fa", "maybe"], "unknown value for -fa"),
    (["-hf", "org/model"], "--hf-repo: models are not downloaded here"),
])
def test_usage_errors(argv, message):
    with pytest.raises(UsageError, match=message):
        translate(argv)


def test_main_exits_2_with_one_error_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        llama_cli.main(["-m", "m.gguf", "--bogus"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: unknown argument: --bogus")


def test_main_warns_once_and_runs_serve(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr("edgeinfer.server.__main__.main",
                        lambda args, prog: calls.append(args) or 0)
    argv = [*PRESET, "--lora", "x.gguf", "-ub", "99"]
    with pytest.raises(SystemExit) as exit_:
        llama_cli.main(argv)
    assert exit_.value.code == 0
    assert calls == [translate(argv).serve_args]
    assert capsys.readouterr().err == ("warning: not supported by edgeinfer, ignored: --lora, "
                                       "-ub\n")


def test_forwarded_options_exist_in_edgeinfer_serve():
    parser = build_parser("edgeinfer serve")
    options = {opt for action in parser._actions for opt in action.option_strings}
    forwarded = {flag.serve for flag in FLAGS if flag.serve and flag.serve != "MODEL"}
    assert forwarded <= options


def test_the_suite_preset_parses_as_edgeinfer_serve_flags():
    args = build_parser("edgeinfer serve").parse_args(translate(PRESET).serve_args)
    settings = settings_from_args(args)
    assert (settings.sampling.temperature, settings.sampling.seed) == (0.8, 42)
    assert (settings.n_batch, settings.n_predict, settings.n_ctx) == (32, 64, 512)
    assert settings.n_ctx_slot == 256
    assert not settings.slots_endpoint and not settings.chat.jinja
    assert settings.aliases == ("tinyllama-2",)


def test_help_lists_every_flag_and_imports_no_numba():
    code = ("import sys\nfrom edgeinfer.server import llama_cli\n"
            "try:\n    llama_cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.rstrip().endswith("False")
    assert all(name in out for flag in FLAGS for name in flag.names)
