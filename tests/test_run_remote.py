"""`edgeinfer run` through a running server (commands/remote.py): the same text as a run
that loads the model itself, the same stdout/stderr contract, and clear errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from test_server_harness import ServerProcess
from tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = write_tiny_model(tmp_path_factory.mktemp("remote") / "tiny.gguf")
    srv = ServerProcess(model, "-np", "2", "-c", "256")
    yield model, srv
    srv.stop()


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "edgeinfer.cli", "run", *map(str, args)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("extra", [[], ["--raw"], ["--system", "be brief"]],
                         ids=["chat", "raw", "system"])
def test_same_text_as_in_process(served, extra):
    model, srv = served
    args = [model, "-n", "6", "--temp", "0", "-p", "the cat", *extra]
    remote, local = run(*args, "--host", srv.url), run(*args, "--local")
    assert remote.returncode == local.returncode == 0, remote.stderr + local.stderr
    assert remote.stdout == local.stdout and remote.stdout  # only the text, on stdout
    assert "eval time" in remote.stderr and "loading" not in remote.stderr


def test_environment_names_the_server_and_quiet_is_quiet(served):
    model, srv = served
    done = run(model, "-n", "3", "--temp", "0", "-q", "-p", "hi",
               env={"EDGEINFER_HOST": srv.url})
    assert done.returncode == 0 and done.stdout and done.stderr == ""


def test_an_explicit_server_that_is_not_there_is_an_error(served):
    model, _ = served
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = run(model, "-p", "hi", "--host", f"127.0.0.1:{port}")
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: no edgeinfer server answers at "
                                  f"http://127.0.0.1:{port}")
    assert done.stdout == ""


def test_a_server_with_another_model_is_not_used_silently(served, tmp_path):
    _, srv = served
    other = write_tiny_model(tmp_path / "other.gguf", seed=3)
    done = run(other, "-p", "hi", "--host", srv.url)
    assert done.returncode == 1
    assert "serves tiny.gguf" in done.stderr and "not " in done.stderr


def test_server_errors_come_back_as_one_line(served):
    model, srv = served
    done = run(model, "-p", "hi", "--host", srv.url, "--grammar", "root ::= (")
    assert done.returncode == 1 and done.stderr.startswith("error: ")
    assert len(done.stderr.strip().splitlines()) == 1
