"""attn_blocks' vector-IR score and value blocks against float64 numpy, on the F16 cache and
on float32 blocks, with repeated and spare rows and partial key groups; then the attention
kernels again on an AVX2 target (8 lanes instead of this machine's 16)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cpu_targets import AVX2_TARGET, require, target_env
from numba import njit

from edgeinfer.kernels.attn_blocks import (
    LANES,
    fits,
    score_block,
    value_block,
    value_block_f16,
)

HEAD_DIMS = [LANES, 64, 256]


@njit
def all_scores(qt, rows, src, s, j0, kvh, a, b, sc, col, k_pf, v_pf, ahead):
    jj = a
    while jj < b:
        score_block(qt, rows[0], rows[1], rows[2], rows[3], src, s, j0, kvh, jj,
                    min(4, b - jj), sc, col, k_pf, v_pf, ahead)
        jj += 4


@njit
def all_values(acc, rows, prow, sc, col, src, s, j0, kvh, a, b):
    value_block(acc, rows[0], rows[1], rows[2], rows[3], prow[0], prow[1], prow[2], prow[3],
                sc, col, src, s, j0, kvh, a, b)


@njit
def all_values_f16(acc, rows, prow, sc, col, src, s, j0, kvh, a, b, rs):
    value_block_f16(acc, rows[0], rows[1], rows[2], rows[3], prow[0], prow[1], prow[2],
                    prow[3], sc, col, src, s, j0, kvh, a, b, rs)


def cache(rng, hd, f32):
    keys = rng.standard_normal((2, 40, 3, hd)).astype(np.float16)
    return keys, (keys.astype(np.float32) if f32 else keys.view(np.uint16))


@pytest.mark.parametrize("f32", [False, True], ids=["f16-cache", "f32-block"])
@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("a, b", [(0, 4), (3, 14), (5, 6)])  # whole, partial, one key
def test_score_block(hd, f32, a, b):
    rng = np.random.default_rng(hd + a)
    keys, src = cache(rng, hd, f32)
    qt = rng.standard_normal((5, hd)).astype(np.float32)
    sc = np.full((5, 40), np.nan, np.float32)
    rows, j0, col = np.array([0, 2, 4, 4]), 5, 7  # a repeated row, rows 1 and 3 untouched
    pf = keys.view(np.uint16)
    all_scores(qt, rows, src, 1, j0, 2, a, b, sc, col, pf, pf, 8)
    want = qt.astype(np.float64) @ keys[1, j0 + a : j0 + b, 2].astype(np.float64).T
    for i, r in enumerate((0, 2, 4)):
        np.testing.assert_allclose(sc[r, col + a : col + b], want[r], rtol=1e-5, atol=1e-5)
        assert np.isnan(np.delete(sc[r], np.arange(col + a, col + b))).all()  # nothing else
    assert np.isnan(sc[[1, 3]]).all()


@pytest.mark.parametrize("f32", [False, True], ids=["f16-cache", "f32-block"])
@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("a, b", [(0, 4), (3, 14), (5, 5)])  # whole, partial, no key
def test_value_block(hd, f32, a, b):
    rng = np.random.default_rng(hd + b)
    values, src = cache(rng, hd, f32)
    acc = rng.standard_normal((7, hd)).astype(np.float32)
    before = acc.copy()
    p = rng.random((5, 40)).astype(np.float32)
    rows, prow, j0, col = np.array([0, 1, 5, 6]), np.array([0, 2, 4, 4]), 5, 7
    all_values(acc, rows, prow, p, col, src, 1, j0, 2, a, b)
    v = values[1, j0 + a : j0 + b, 2].astype(np.float64)
    for r, pr in zip(rows, prow):
        want = before[r] + p[pr, col + a : col + b].astype(np.float64) @ v
        np.testing.assert_allclose(acc[r], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(acc[2:5], before[2:5])  # rows not named stay as they were


@pytest.mark.parametrize("hd", HEAD_DIMS)
def test_value_block_f16_rounds_after_every_key(hd):
    """Flash attention's F16 path: key by key, a rescale (factor != 1) then the multiply-add,
    each rounded to F16, against numpy doing exactly that (float64 products, so only a rare
    double rounding may differ, by one F16 step)."""
    rng = np.random.default_rng(hd)
    values, src = cache(rng, hd, False)
    acc = rng.standard_normal((7, hd)).astype(np.float16).astype(np.float32)
    before = acc.copy()
    p = rng.random((5, 40)).astype(np.float32)
    rs = np.ones((5, 40), np.float32)
    rs[0, 9], rs[2, 12], rs[4, 9] = 0.5, 0.25, 0.125  # new maxima at a few keys
    rows, prow, j0, col, a, b = np.array([0, 1, 5, 6]), np.array([0, 2, 4, 4]), 5, 7, 0, 14
    all_values_f16(acc, rows, prow, p, col, src, 1, j0, 2, a, b, rs)
    f16 = np.float16
    for r, pr in zip(rows, prow):
        want = before[r].copy()
        for jj in range(a, b):
            if rs[pr, col + jj] != 1.0:
                want = (want * rs[pr, col + jj]).astype(f16).astype(np.float32)
            v = values[1, j0 + jj, 2].astype(np.float64)
            exact = p[pr, col + jj].astype(np.float64) * v + want.astype(np.float64)
            want = exact.astype(np.float32).astype(f16).astype(np.float32)
        diff = np.abs(acc[r] - want)
        assert (diff == 0).mean() > 0.95 and diff.max() <= 2.0 ** -10 * np.abs(want).max()
    np.testing.assert_array_equal(acc[2:5], before[2:5])
    unrounded = before[0] + p[0, col + a : col + b].astype(np.float64) @ \
        values[1, j0 + a : j0 + b, 2].astype(np.float64)
    assert not np.allclose(acc[0], unrounded, atol=1e-4)  # the rescale and rounding happened


def test_fits_whole_vectors_only():
    assert fits(LANES) and fits(4 * LANES) and not fits(LANES // 2) and not fits(LANES + 4)


@pytest.mark.slow
def test_attention_on_an_avx2_target(tmp_path: Path) -> None:
    """This machine compiles 16-lane blocks; an AVX2 target (numba's own target variables)
    gets 8-lane ones, whose reduction tree and chunk loops differ: the block tests and both
    attention kernels' tests again there."""
    require(AVX2_TARGET)
    env = target_env(AVX2_TARGET, tmp_path)
    check = "from edgeinfer.kernels.attn_blocks import LANES; print(LANES)"
    lanes = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True)
    assert lanes.stdout.strip() == "8", lanes.stderr
    tests = Path(__file__).parent
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
           __file__, str(tests / "test_attention.py"), str(tests / "test_flash.py"),
           "-k", "not threads"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
