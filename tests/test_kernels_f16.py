"""F16 conversions (kernels/f16.py) against numpy's, on this CPU and on a target without
hardware half conversions (software path), bit for bit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cpu_targets import GENERIC_TARGET, require, target_env
from numba import njit

from edgeinfer.kernels.f16 import f16_bits_to_f32, f32_to_f16_bits


@njit(cache=True)
def _widen(bits, out):
    for i in range(bits.shape[0]):
        out[i] = f16_bits_to_f32(bits[i])


@njit(cache=True)
def _narrow(values, out):
    for i in range(values.shape[0]):
        out[i] = f32_to_f16_bits(values[i])


def test_every_half_widens_exactly():
    bits = np.arange(1 << 16, dtype=np.uint16)
    out = np.empty(1 << 16, np.float32)
    _widen(bits, out)
    want = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(out), nan)
    np.testing.assert_array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_narrowing_rounds_to_nearest_even():
    rng = np.random.default_rng(0)
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    halves = halves[np.isfinite(halves)]
    above = np.nextafter(halves, np.float32(np.inf))
    mid = (halves[:-1].astype(np.float64) + halves[1:]) / 2  # ties between neighbours
    values = np.concatenate([
        halves, above, np.nextafter(halves, np.float32(-np.inf)), mid.astype(np.float32),
        rng.standard_normal(20000).astype(np.float32) * np.float32(2.0) ** rng.integers(
            -30, 20, 20000).astype(np.float32),
        np.array([65504, 65519.99, 65520, 1e9, np.inf, -np.inf, 0.0, -0.0, 2.0**-25,
                  2.0**-26, 3 * 2.0**-26, 1e-45], np.float32),
    ]).astype(np.float32)
    out = np.empty(len(values), np.uint16)
    _narrow(values, out)
    with np.errstate(over="ignore"):  # numpy warns on the values that round to inf
        want = values.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(out, want)
    nan = np.empty(1, np.uint16)
    _narrow(np.array([np.nan], np.float32), nan)
    assert np.isnan(nan.view(np.float16)[0])


@pytest.mark.slow
def test_software_path_without_f16c(tmp_path: Path) -> None:
    """NUMBA_CPU_NAME=generic has no F16C: the same tests through the integer code, and the
    kernels that use it compile and agree with their references (llvm.fma stays fused there:
    a call to libm's fmaf, so ggml's expf is still matched bit for bit)."""
    require(GENERIC_TARGET)
    env = target_env(GENERIC_TARGET, tmp_path)
    check = "from edgeinfer.kernels.target import F16_NATIVE; print(F16_NATIVE)"
    native = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True,
                            text=True)
    assert native.stdout.strip() == "False", native.stderr
    tests = Path(__file__).parent
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
           str(tests / "test_kernels_f16.py"), str(tests / "test_kernels_kquants.py"),
           str(tests / "test_attention.py"), str(tests / "test_expf.py"),
           "-k", "not threads"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
