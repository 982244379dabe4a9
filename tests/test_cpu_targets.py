"""The rule that keeps code compiled for another CPU off a host that lacks its instructions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cpu_targets import (
    AVX2_TARGET,
    GENERIC_TARGET,
    VNNI_NO_BITALG_TARGET,
    host_can_run,
    target_env,
    target_features,
)


def test_a_named_cpu_brings_its_own_features() -> None:
    assert {"avx2", "bmi2", "movbe", "lzcnt"} <= target_features(AVX2_TARGET)
    assert {"avx512vnni", "avx512bw", "bmi2"} <= target_features(VNNI_NO_BITALG_TARGET)
    assert "avx512bitalg" not in target_features(VNNI_NO_BITALG_TARGET)
    assert target_features(GENERIC_TARGET) == set()


def test_an_emulated_avx2_host_runs_avx2_code_only(tmp_path: Path) -> None:
    """The whole suite on NUMBA_CPU_NAME=haswell (an AVX2-only host, emulated) runs the AVX2
    and generic targets' tests and skips the AVX-512 one; the child's target variables are the
    target's alone."""
    script = ("import json, os; from cpu_targets import *; print(json.dumps([host_can_run(t) "
              "for t in (AVX2_TARGET, GENERIC_TARGET, VNNI_NO_BITALG_TARGET)]))")
    env = {**target_env(AVX2_TARGET, tmp_path), "PYTHONPATH": str(Path(__file__).parent)}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert json.loads(run.stdout) == [True, True, False], run.stderr
    assert host_can_run(GENERIC_TARGET) == (os.uname().machine in ("x86_64", "amd64"))


def test_a_child_target_replaces_an_emulated_hosts_variables(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("NUMBA_CPU_NAME", "haswell")
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx2")
    env = target_env(GENERIC_TARGET, tmp_path)
    assert env["NUMBA_CPU_NAME"] == "generic" and "NUMBA_CPU_FEATURES" not in env
    assert env["NUMBA_CACHE_DIR"] == str(tmp_path)


def test_a_host_whose_features_llvm_cannot_read_takes_the_portable_path(monkeypatch) -> None:
    """LLVM lists host features only on some OSes (it raises elsewhere); numba then compiles
    with none, and target.py must neither fail at import nor pick a path they lack."""
    import numba

    from edgeinfer.kernels import target

    def unreadable():
        raise RuntimeError("failed to get host cpu features.")

    monkeypatch.setattr(target.llvm_binding, "get_host_cpu_features", unreadable)
    monkeypatch.setattr(numba.config, "CPU_NAME", None)
    monkeypatch.setattr(numba.config, "CPU_FEATURES", None)
    assert target.host_cpu_features() == set()
