"""The skip policy (tests/skip_policy.py) on a tiny generated suite, run in a child pytest: a
skip the allow-list does not match fails the run with one line per reason; allowed ones pass.
Also the repository's allow-list: it parses, and it allows none of the groups CI must run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from skip_policy import is_allowed, load_patterns

TESTS = Path(__file__).parent
SUITE = '''
import pytest

pytest.importorskip("no_such_module_anywhere", reason="the browser is not installed")


def test_runs():
    assert True
'''
UNIT = '''
import pytest


def test_runs():
    assert True


def test_no_gpu():
    pytest.skip("no CUDA GPU here")


@pytest.mark.parametrize("n", [1, 2])
def test_isa(n):
    pytest.skip("this CPU lacks avx512")


@pytest.mark.xfail(reason="known")
def test_known():
    assert False
'''


def child_pytest(tmp_path: Path, files: dict[str, str], *args: str):
    """pytest with the plugin on `files`, written to tmp_path, its own rootdir and config."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "skip_policy", "-p", "no:cacheprovider",
         *args, *files], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(TESTS)},
        capture_output=True, text=True, timeout=300)


def run_suite(tmp_path: Path, allowed: str, files: dict[str, str]):
    (tmp_path / "allowed.txt").write_text(allowed)
    return child_pytest(tmp_path, files, "--allowed-skips", "allowed.txt")


def disallowed_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith("DISALLOWED SKIP")]


def test_allowed_skips_pass(tmp_path):
    done = run_suite(tmp_path, "# why\nno CUDA GPU here\nthis CPU lacks avx[0-9]+  # why\n",
                     {"test_unit.py": UNIT})
    assert done.returncode == 0, done.stdout
    assert disallowed_lines(done) == []
    assert "1 passed, 3 skipped, 1 xfailed" in done.stdout


def test_a_skip_not_allowed_fails_the_run(tmp_path):
    done = run_suite(tmp_path, "no CUDA GPU\n", {"test_unit.py": UNIT})  # a prefix: no match
    assert done.returncode == 1, done.stdout
    assert disallowed_lines(done) == [
        "DISALLOWED SKIP (1) test_unit.py:10: no CUDA GPU here",
        "DISALLOWED SKIP (2) test_unit.py:15: this CPU lacks avx512",
    ]


def test_a_skipped_module_not_allowed_fails_the_run(tmp_path):
    done = run_suite(tmp_path, "no CUDA GPU here\n", {"test_suite.py": SUITE})
    assert done.returncode == 1, done.stdout
    [line] = disallowed_lines(done)
    assert line.endswith(": the browser is not installed")


def test_without_the_option_skips_do_not_fail(tmp_path):
    done = child_pytest(tmp_path, {"test_unit.py": UNIT})
    assert done.returncode == 0, done.stdout
    assert "1 passed, 3 skipped, 1 xfailed" in done.stdout


ALLOWED = load_patterns(TESTS / "allowed_skips.txt")


@pytest.mark.parametrize("reason", [
    "this CPU cannot run cascadelake code (lacks avx512bw, avx512vnni)",
    "this CPU has no AVX-512 VNNI",
    "llama.cpp parses Kimi-K2 with its kimi-k2 handler",
])
def test_repository_allows_machine_and_reference_skips(reason):
    assert is_allowed(reason, ALLOWED)


@pytest.mark.parametrize("reason", [
    "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)",
    "selenium is not installed (pip install selenium)",
    "Ray Serve not installed (extra: ray)",
    "numba-cuda not installed (extra: cuda)",
    "the 'structured' extra",
    "could not import 'llguidance': No module named 'llguidance'",
    "real model SmolLM2-135M-Instruct.Q4_1.gguf not pulled (run scripts/fetch_models.py)",
    "SmolLM2 not downloaded",
    "the split needs 2 threads",
    "this CPU cannot run haswell code (lacks avx2)",
    "no assembler for sm_90: ptxas not found",
])
def test_repository_does_not_allow_groups_ci_must_run(reason):
    assert not is_allowed(reason, ALLOWED)
