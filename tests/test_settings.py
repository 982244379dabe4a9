"""The settings table (edgeinfer/settings.py) and the three front ends built from it: each
front end takes exactly the table's entries for it, under every spelling, with the table's
default; the CLI's, `edgeinfer serve`'s and edgeinfer-server's defaults are the table's."""

from __future__ import annotations

import subprocess
import sys
from enum import Enum
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from edgeinfer import settings
from edgeinfer.cli import app
from edgeinfer.commands.run import RunOptions
from edgeinfer.sampling_params import N_PREDICT, SamplingParams
from edgeinfer.server.llama_cli import FLAGS, translate
from edgeinfer.server.options import ServerSettings, build_parser, settings_from_args
from edgeinfer.settings import DEFAULTS, SERVE, SETTINGS, for_front
from edgeinfer.spec.params import SpecParams

CLI_COMMANDS = ("run", "chat", "info", "bench")
CLICK_TYPES = {int: "IntParamType", float: "FloatParamType", str: "StringParamType",
               bool: "BoolParamType", list: "StringParamType", Path: "TyperPath"}


def given(s: settings.Setting) -> bool:
    """A setting whose default can be written on a command line (not None, not a switch)."""
    return s.default is not None and not s.switch and s.type is not list


# -- the table ---------------------------------------------------------------------------------
def test_names_are_unique_and_no_front_spells_two_settings_alike():
    assert len(settings.BY_NAME) == len(SETTINGS)
    for front in settings.FRONTS:
        spellings = [f for s in for_front(front) for f in (*s.flags, *s.off)]
        assert len(spellings) == len(set(spellings)), front


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_each_row_is_consistent(s):
    assert s.help and s.fronts <= set(settings.FRONTS)
    assert s.default is None or isinstance(s.default, (tuple if s.type is list else s.type))
    assert not s.choices or s.default in s.choices
    assert not s.off or s.switch
    assert (s.group in settings_groups()) == (SERVE in s.fronts and bool(s.flags))
    assert "=" not in s.llama  # spelled out by _s


def settings_groups() -> set[str]:
    from edgeinfer.server.options import GROUPS

    return set(GROUPS)


def test_sampling_and_speculative_defaults_are_the_dataclasses():
    sampling, spec = SamplingParams(), SpecParams()
    for name in ("top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                 "presence_penalty", "frequency_penalty"):
        assert DEFAULTS[name] == getattr(sampling, name), name
    assert DEFAULTS["temp"] == sampling.temperature and sampling.seed is None
    assert DEFAULTS["seed"] == settings.SEED_RANDOM and DEFAULTS["n_predict"] == N_PREDICT
    assert (DEFAULTS["spec_type"], DEFAULTS["model_draft"], DEFAULTS["spec_draft_p_min"]) == \
        (spec.type, spec.draft_model, spec.p_min)
    assert (DEFAULTS["spec_draft_n_max"], DEFAULTS["spec_draft_n_min"]) == (spec.n_max,
                                                                            spec.n_min)
    assert (DEFAULTS["spec_ngram_simple_size_n"], DEFAULTS["spec_ngram_simple_size_m"]) == \
        (spec.ngram_size_n, spec.ngram_size_m)


def test_the_table_imports_nothing_heavy():
    code = ("import sys, edgeinfer.settings, edgeinfer.server.llama_cli\n"
            "print(sorted(m for m in ('numpy', 'numba', 'typer') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


# -- the typer CLI -----------------------------------------------------------------------------
def cli_params(command: str) -> dict:
    return {p.name: p for p in typer.main.get_command(app).commands[command].params}


@pytest.mark.parametrize("command", CLI_COMMANDS)
def test_cli_commands_take_exactly_their_table_entries(command):
    params = cli_params(command)
    assert set(params) == {s.name for s in for_front(command)}
    for s in for_front(command):
        p = params[s.name]
        assert set(p.opts) == set(s.flags) or (not s.flags and p.opts == [s.name]), s.name
        default = p.default.value if isinstance(p.default, Enum) else p.default
        assert default == (list(s.default) if s.type is list else s.default), s.name
        if s.choices and s.name != "spec_type":  # spec_type: SpecParams names a bad one
            assert [c for c in p.type.choices] == list(s.choices), s.name
        else:
            assert type(p.type).__name__ == CLICK_TYPES[s.type], s.name


# What each command hands over, with the commands themselves replaced.
CALLS = {"run": ("edgeinfer.commands.run", "run_command"),
         "chat": ("edgeinfer.commands.chat.repl", "chat_command"),
         "info": ("edgeinfer.commands.info", "info_command"),
         "bench": ("edgeinfer.commands.bench", "bench_command")}


def invoke(monkeypatch, command: str, *flags: str):
    module, name = CALLS[command]
    seen = []
    monkeypatch.setattr(f"{module}.{name}", lambda *args: seen.append(args))
    extra = ["-p", "hi"] if command == "run" else []
    result = CliRunner().invoke(app, [command, "m.gguf", *extra, *flags])
    assert result.exit_code == 0, result.output
    (args,) = seen
    return args


@pytest.mark.parametrize("command", CLI_COMMANDS)
def test_cli_accepts_every_spelling_with_its_default(monkeypatch, command):
    defaults = invoke(monkeypatch, command)
    if command == "run":
        assert defaults == (RunOptions(model="m.gguf", prompt="hi"),)
    if command == "chat":
        assert defaults == (RunOptions(model="m.gguf", prompt=None),)
    for s in filter(given, for_front(command)):
        for flag in s.flags:
            assert invoke(monkeypatch, command, flag, str(s.default)) == defaults, flag


def test_bench_and_info_defaults_are_the_table_s(monkeypatch):
    d = DEFAULTS
    assert invoke(monkeypatch, "bench") == (
        "m.gguf", d["n_prompt"], d["n_gen"], d["threads"], d["reps"], d["ctx_size"],
        d["as_json"], d["n_depth"], d["flash_attn"] == "on", int(d["gpu_layers"]))
    assert invoke(monkeypatch, "info") == ("m.gguf", d["ctx_size"])


# -- edgeinfer serve ---------------------------------------------------------------------------
def test_serve_takes_exactly_its_table_entries():
    parser = build_parser("edgeinfer serve")
    taken = {o for a in parser._actions for o in a.option_strings} - {"-h", "--help"}
    assert taken == {f for s in for_front(SERVE) for f in (*s.flags, *s.off)}
    dests = {a.dest: a.default for a in parser._actions if a.dest != "help"}
    assert dests == {s.name: s.default for s in for_front(SERVE)}


def test_serve_defaults_are_server_settings_defaults():
    assert settings_from_args(build_parser("x").parse_args([])) == ServerSettings()


def written(s: settings.Setting, flag: str) -> list[str] | None:
    """`flag` given the setting's default, or None where the default is the flag's absence
    (None, a switch that is off)."""
    if given(s):
        return [flag, str(s.default)]
    return [flag] if s.switch and s.default and flag in s.flags else None


@pytest.mark.parametrize("s", [s for s in for_front(SERVE) if s.flags], ids=lambda s: s.name)
def test_serve_accepts_every_spelling_with_its_default(s):
    parser = build_parser("edgeinfer serve")
    for flag in (*s.flags, *s.off):
        argv = written(s, flag)
        if argv is not None:
            assert settings_from_args(parser.parse_args(argv)) == ServerSettings(), flag
        elif s.switch:  # the switch is taken, and does something
            assert settings_from_args(parser.parse_args([flag])) != ServerSettings(), flag


# -- edgeinfer-server --------------------------------------------------------------------------
def test_edgeinfer_server_forwards_each_llama_spelling_to_its_setting():
    forwarded = {n: f.serve for f in FLAGS if f.serve and f.serve != "MODEL" for n in f.names}
    want = {n: (s.off[0] if n in s.off else s.long) for s in SETTINGS for n in s.llama}
    assert forwarded == want
    names = [n for f in FLAGS for n in f.names]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.llama], ids=lambda s: s.name)
def test_edgeinfer_server_accepts_every_spelling_with_its_default(s):
    parser = build_parser("edgeinfer-server")
    for flag in s.llama:
        argv = written(s, flag)
        if argv is None and not s.switch:
            continue  # None: the default is the flag's absence
        serve_args = translate(["-m", "m.gguf", *(argv or [flag])]).serve_args
        assert serve_args[0] == "m.gguf"
        got = settings_from_args(parser.parse_args(serve_args[1:]))
        assert (got == ServerSettings()) is (argv is not None), flag


def test_edgeinfer_server_with_no_flags_gets_serve_s_defaults():
    out = translate(["-m", "m.gguf"])
    assert out.serve_args == ["m.gguf"] and out.unsupported == []


# -- bad values stay one line ------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["--port", "x"], ["-fa", "maybe"], ["--reasoning", "no"],
                                  ["--spec-type", "eagle"]])
def test_serve_bad_values_are_one_line(argv):
    out = subprocess.run([sys.executable, "-m", "edgeinfer.server", *argv],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error:"), out.stderr


def test_cli_bad_spec_type_is_one_line():
    out = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "run", "m.gguf", "-p", "x",
                          "--spec-type", "eagle"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr == ("error: unknown --spec-type 'eagle'; expected one of none, "
                          "ngram-simple, draft-simple\n")
