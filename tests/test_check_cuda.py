"""scripts/check_cuda.py's verdict on made-up results (this machine has no GPU): a failed or
skipped kernel test, a broken test run and each missed target make it fail, naming which;
and its exit 2 with one line without a GPU."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import check_cuda  # noqa: E402

GOOD_MODEL = {
    "parity": {"positions": 128, "top1_agree": 0.99, "top1_agree_clear": 1.0,
               "median_logit_diff": 0.01, "max_logit_diff": 0.3},
    "speed": {"threads": 16, "launches_per_token": 270.0,
              "ratio": {"pp512": 14.0, "tg128": 4.2}},
}
GOOD = {"gpu": [{"name": "H100"}],
        "kernel_tests": {"returncode": 0, "tests": 120, "failed": [], "skipped": {},
                         "summary": ["120 passed in 80.0s"]},
        "models": {"SmolLM2.gguf": GOOD_MODEL, "gemma.gguf": copy.deepcopy(GOOD_MODEL)}}


def changed(keys: tuple[str, ...], value) -> dict:
    """GOOD with the field at keys set to value."""
    result = copy.deepcopy(GOOD)
    node = result
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return result


def test_all_targets_met_is_no_problem():
    assert check_cuda.verdict(GOOD) == []


@pytest.mark.parametrize("field, value, expect", [
    ("failed", ["tests.test_cuda_kernels::test_q4_k"],
     "kernel test failed: tests.test_cuda_kernels::test_q4_k"),
    ("skipped", {"tests.test_cuda_ptx::test_ptxas[80]": "ptxas not found"},
     "kernel test skipped: tests.test_cuda_ptx::test_ptxas[80]: ptxas not found"),
    ("tests", 0, "kernel tests: pytest exited 0 after 0 tests"),
    ("returncode", 2, "kernel tests: pytest exited 2 after 120 tests"),
])
def test_a_kernel_test_problem_fails(field, value, expect):
    [problem] = check_cuda.verdict(changed(("kernel_tests", field), value))
    assert problem.startswith(expect)


@pytest.mark.parametrize("field, value, expect", [
    (("parity", "top1_agree_clear"), 0.98, "parity: top-1 agrees at 0.980"),
    (("parity", "top1_agree_clear"), None, "parity: no position with a clear top-2 margin"),
    (("parity", "median_logit_diff"), 0.12, "parity: median logit difference 0.1200"),
    (("parity", "median_logit_diff"), float("nan"), "parity: median logit difference nan"),
    (("speed", "ratio", "tg128"), 2.9, "speed: tg128 GPU / CPU 2.90x (target >= 3.0x)"),
    (("speed", "ratio", "pp512"), 9.5, "speed: pp512 GPU / CPU 9.50x (target >= 10.0x)"),
])
def test_a_missed_target_fails_naming_the_model(field, value, expect):
    [problem] = check_cuda.verdict(changed(("models", "gemma.gguf", *field), value))
    assert problem.startswith(f"gemma.gguf: {expect}")


def test_junit_outcomes_reads_failures_errors_and_skips():
    xml = """<testsuites><testsuite>
      <testcase classname="tests.test_cuda_ptx" name="test_a[80]"/>
      <testcase classname="tests.test_cuda_ptx" name="test_b[80]"><failure message="x"/></testcase>
      <testcase classname="tests.test_cuda_kernels" name="test_c"><error message="y"/></testcase>
      <testcase classname="tests.test_cuda_kernels" name="test_d">
        <skipped type="pytest.skip" message="no GPU"/></testcase>
    </testsuite></testsuites>"""
    assert check_cuda.junit_outcomes(xml) == {
        "tests": 4,
        "failed": ["tests.test_cuda_ptx::test_b[80]", "tests.test_cuda_kernels::test_c"],
        "skipped": {"tests.test_cuda_kernels::test_d": "no GPU"}}


def test_without_a_gpu_exits_2_with_one_line():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, str(SCRIPTS / "check_cuda.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stdout.splitlines()
    assert json.loads(line)["gpu"] is None
