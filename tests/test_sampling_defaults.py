"""Every front end takes its sampling defaults from `SamplingParams` (and the CLI and server
their length default from `N_PREDICT`): the CLI's flags, `RunOptions`, `Model.generate` and
the server's request fields."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import typer
from typer.testing import CliRunner

from edgeinfer.api import Model
from edgeinfer.cli import app
from edgeinfer.commands import run as run_module
from edgeinfer.commands.run import RunOptions
from edgeinfer.sampling import N_PREDICT, SamplingParams
from edgeinfer.server.params import GenParams, parse_chat, parse_completion

FIELDS = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
CLI_NAMES = {"temperature": "temp"}  # dataclass field -> `edgeinfer run` parameter
CLI_SEED_RANDOM = -1  # how the --seed flag spells SamplingParams.seed None


def test_defaults_are_llama_cpp_s():
    assert FIELDS == {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
                      "repeat_penalty": 1.0, "repeat_last_n": 64, "presence_penalty": 0.0,
                      "frequency_penalty": 0.0, "seed": None}
    assert N_PREDICT == -1


def test_cli_flag_defaults():
    run = typer.main.get_command(app).commands["run"]
    defaults = {p.name: p.default for p in run.params}
    for name, default in FIELDS.items():
        flag = defaults[CLI_NAMES.get(name, name)]
        assert flag == (CLI_SEED_RANDOM if name == "seed" and default is None else default), name
    assert defaults["n_predict"] == N_PREDICT


def run_options(monkeypatch, *flags: str) -> RunOptions:
    """The RunOptions `edgeinfer run` builds from `flags`, without running anything."""
    seen = []
    monkeypatch.setattr(run_module, "run_command", seen.append)
    result = CliRunner().invoke(app, ["run", "tiny.gguf", "-p", "hi", *flags])
    assert result.exit_code == 0, result.output
    (options,) = seen
    return options


def test_cli_run_without_flags_passes_the_defaults(monkeypatch):
    options = run_options(monkeypatch)
    assert options.sampling == SamplingParams()
    assert options.n_predict == N_PREDICT


def test_cli_flags_reach_sampling_params(monkeypatch):
    for name, default in FIELDS.items():
        value = 7 if default is None else default + 1
        flag = "--" + CLI_NAMES.get(name, name).replace("_", "-")
        options = run_options(monkeypatch, flag, str(value))
        assert getattr(options.sampling, name) == value, name


def test_run_options_defaults():
    options = RunOptions(model=None, prompt="hi")
    assert options.sampling == SamplingParams()
    assert options.n_predict == N_PREDICT


def test_model_generate_signature_defaults():
    parameters = inspect.signature(Model.generate).parameters
    for name, default in FIELDS.items():
        assert parameters[name].default == default, name


@pytest.mark.parametrize("parse", [
    lambda: parse_completion({"prompt": "x"}, oai=False).params,
    lambda: parse_completion({"prompt": "x"}, oai=True).params,
    lambda: parse_chat({"messages": [{"role": "user", "content": "x"}]}).params,
    GenParams,
], ids=["completion", "v1-completions", "v1-chat", "GenParams"])
def test_server_request_defaults(parse):
    params = parse()
    assert params.sampling == SamplingParams()
    assert params.n_predict == N_PREDICT


def test_server_reads_every_sampling_field():
    """A request field under each dataclass name reaches SamplingParams (floats are moved
    within [0, 1], where top_p and min_p are not clamped)."""
    for name, default in FIELDS.items():
        value = 7 if default is None else default + 1 if isinstance(default, int) \
            else default / 2 + 0.25
        sampling = parse_completion({"prompt": "x", name: value}, oai=False).params.sampling
        assert getattr(sampling, name) == value, name
