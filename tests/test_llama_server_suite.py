"""llama.cpp's own server tests (llama-cpp-python 0.3.36's tools/server/tests) against
`edgeinfer-server`, through scripts/llama_server_suite.sh: in the files of CI_FILES, every
test that passes on llama-server with the same model (the baseline JSON) must pass here,
except the ones known-differences.txt names with the reason (issue 33)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "scripts" / "llama_server_suite"
# The files that fit CI's time budget and have tests llama-server passes (about 7 minutes
# together; docs/llama-server-suite.md has each file's seconds).
CI_FILES = (
    "unit/test_basic.py",
    "unit/test_tokenize.py",
    "unit/test_ignore_eos.py",
    "unit/test_kv_keep_only_active.py",
    "unit/test_metrics.py",
    "unit/test_sleep.py",
    "unit/test_template.py",
    "unit/test_chat_completion.py",
    "unit/test_completion.py",
    "unit/test_compat_anthropic.py",
    "unit/test_compat_oai_responses.py",
    "unit/test_compat_gcp.py",
    "unit/test_security.py",
    "unit/test_tool_call.py",
)


def known_differences() -> dict[str, str]:
    """nodeid -> why it passes on llama-server and not here (one per line: nodeid  reason)."""
    known = {}
    for line in (SUITE / "known-differences.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            nodeid, _, reason = line.partition("  ")
            known[nodeid.strip()] = reason.strip()
    return known


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def outcomes(real_model, tmp_path_factory) -> dict:
    model = real_model("SmolLM2-135M-Instruct.Q4_1.gguf")
    tmp = tmp_path_factory.mktemp("llama-suite")
    shim = tmp / "edgeinfer-server"  # this interpreter, whatever is on PATH
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m edgeinfer.server.llama_cli \"$@\"\n")
    shim.chmod(0o755)
    env = dict(os.environ, SUITE_MODEL=str(model), SUITE_JSON=str(tmp / "suite.json"),
               SUITE_SCRATCH=str(tmp / "scratch"), SUITE_THREADS="1", PORT=str(_free_port()))
    run = subprocess.run(["bash", str(REPO / "scripts" / "llama_server_suite.sh"), str(shim),
                          *CI_FILES, "-m", "not slow"],  # as the baseline was run
                         env=env, capture_output=True, text=True, timeout=1800)
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads((tmp / "suite.json").read_text(encoding="utf-8"))


@pytest.mark.slow
@pytest.mark.parametrize("name", CI_FILES)
def test_passes_what_llama_server_passes(outcomes, name):
    baseline = json.loads((SUITE / "baseline-llama-server.json").read_text(encoding="utf-8"))
    known = known_differences()
    expected = [n for n, t in baseline["tests"].items()
                if n.startswith(name + "::") and t["outcome"] == "passed"]
    assert expected, f"the baseline has no passing test in {name}"
    failing = {n: outcomes["tests"].get(n, {"outcome": "not run", "reason": ""})
               for n in expected if n not in known}
    failing = {n: t for n, t in failing.items() if t["outcome"] != "passed"}
    assert not failing, "\n".join(f"{n}: {t['outcome']} {t['reason'][:200]}"
                                  for n, t in failing.items())


def test_known_differences_are_real():
    """Each entry names a test the baseline passes, with a reason: the list cannot hide a
    typo or a test llama-server fails anyway."""
    baseline = json.loads((SUITE / "baseline-llama-server.json").read_text(encoding="utf-8"))
    for nodeid, reason in known_differences().items():
        assert baseline["tests"].get(nodeid, {}).get("outcome") == "passed", nodeid
        assert reason, nodeid
