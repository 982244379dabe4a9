"""k-quant matmul kernels and the Q8_K activation quantizer, against independent references:
gguf-py's dequantization in float64, and a numpy transcription of quantize_row_q8_K_ref."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cpu_targets import AVX2_TARGET, require, target_env
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from edgeinfer.kernels import kquants, ops
from edgeinfer.kernels.registry import QUANT_FORMATS

K_TYPES = [
    GGMLQuantizationType.Q2_K,
    GGMLQuantizationType.Q3_K,
    GGMLQuantizationType.Q4_K,
    GGMLQuantizationType.Q5_K,
    GGMLQuantizationType.Q6_K,
]

# Byte offsets of the f16 super-block scales (d, and dmin where the type has one).
F16_OFFSETS = {
    GGMLQuantizationType.Q2_K: (80, 82),
    GGMLQuantizationType.Q3_K: (108,),
    GGMLQuantizationType.Q4_K: (0, 2),
    GGMLQuantizationType.Q5_K: (0, 2),
    GGMLQuantizationType.Q6_K: (208,),
}


def random_weights(rng, qtype, n_out: int, n_in: int) -> np.ndarray:
    """Random GGML blocks: every bit pattern for quants and packed scales, and finite f16
    d/dmin of a realistic size (random bytes there would give inf/NaN)."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_out, n_in // block, type_size), dtype=np.uint8)
    for offset in F16_OFFSETS[qtype]:
        d = rng.uniform(-0.02, 0.02, size=raw.shape[:2]).astype(np.float16)
        raw[:, :, offset : offset + 2] = d[..., None].view(np.uint8)
    return raw.reshape(n_out, -1)


def quantize(x: np.ndarray):
    n_tok, n_in = x.shape
    xq = np.empty((n_tok, n_in), np.int8)
    xd = np.empty((n_tok, n_in // 256), np.float32)
    xs = np.empty((n_tok, n_in // 16), np.float32)
    kquants.quantize_q8_k(x, xq, xd, xs, x)
    return xq, xd, xs


def q8_k_ref(x: np.ndarray):
    """numpy transcription of ggml-quants.c quantize_row_q8_K_ref for one row."""
    qs, ds = [], []
    for block in x.astype(np.float32).reshape(-1, 256):
        amax, vmax = np.float32(0), np.float32(0)
        for v in block:
            if abs(v) > amax:
                amax, vmax = abs(v), v
        if amax == 0:
            qs.append(np.zeros(256, np.int32))
            ds.append(np.float32(0))
            continue
        iscale = np.float32(-127.0) / vmax
        # nearest_int: add 1.5 * 2^23 and read the mantissa bits (ties to even).
        val = (iscale * block + np.float32(12582912.0)).view(np.int32)
        qs.append(np.minimum(127, (val & 0x007FFFFF) - 0x00400000))
        ds.append(np.float32(1.0) / iscale)
    q = np.concatenate(qs)
    return q.astype(np.int8), np.array(ds, np.float32), q.reshape(-1, 16).sum(axis=1)


def run_kernel(qtype, w, xq, xd, xs, x) -> np.ndarray:
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    QUANT_FORMATS[qtype].matmul(w, xq, xd, xs, x, out)
    return out


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_registered(qtype):
    fmt = QUANT_FORMATS[qtype]
    assert fmt.act is kquants.Q8_K_ACT
    assert (fmt.act.block, fmt.act.sum_block) == (256, 16)


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_in", [256, 512, 1024, 2048])
@pytest.mark.parametrize("n_tok", [1, 3, 17, 64])
@pytest.mark.parametrize("n_out", [7, 16])
def test_matmul_matches_dequantized_reference(qtype, n_in, n_tok, n_out):
    rng = np.random.default_rng([int(qtype), n_in, n_tok, n_out])
    w = random_weights(rng, qtype, n_out, n_in)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    xq, xd, xs = quantize(x)
    out = run_kernel(qtype, w, xq, xd, xs, x)

    w64 = dequantize(w, qtype).astype(np.float64)  # (n_out, n_in)
    x_dequant = (xq.reshape(n_tok, -1, 256) * xd[..., None].astype(np.float64)).reshape(x.shape)
    # (a) same activations as the kernel: only f32 rounding separates the two.
    assert rel_err(out, x_dequant @ w64.T) < 1e-5
    # (b) exact activations: Q8_K's step is max/127 and a Gaussian block's max is ~3 rms, so the
    # error is ~0.7% rms of the output (measured median 0.7%, worst case here 1.6% for 7 outputs).
    exact = x.astype(np.float64) @ w64.T
    assert np.linalg.norm(out - exact) / np.linalg.norm(exact) < 0.02


def test_matmul_zero_activations_give_zero():
    rng = np.random.default_rng(1)
    x = np.zeros((2, 512), np.float32)
    xq, xd, xs = quantize(x)
    for qtype in K_TYPES:
        w = random_weights(rng, qtype, 5, 512)
        assert not run_kernel(qtype, w, xq, xd, xs, x).any()


@pytest.mark.parametrize("n_tok", [3, 5, ops.PARALLEL_ROWS + 5],
                         ids=["serial", "threads-by-values", "threads"])
def test_q8_k_matches_reference_transcription(n_tok):
    rng = np.random.default_rng(2)
    scale = rng.uniform(0.01, 100, (n_tok, 1))
    x = (rng.standard_normal((n_tok, 1024)) * scale).astype(np.float32)
    x[1, 256:512] = 0.0  # one all-zero block
    x[2, 600], x[2, 700] = 50.0, -50.0  # equal magnitudes: the first one is the max
    xq, xd, xs = quantize(x)
    for tok in range(n_tok):
        q, d, bsums = q8_k_ref(x[tok])
        np.testing.assert_array_equal(xq[tok], q)
        np.testing.assert_array_equal(xd[tok], d)
        np.testing.assert_array_equal(xs.view(np.int32)[tok], bsums)  # int32 in the bits
    assert xd[1, 1] == 0 and not xq[1, 256:512].any() and not xs.view(np.int32)[1, 16:32].any()


def test_q8_k_bsums_are_group_sums():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 2048)).astype(np.float32)
    xq, _, xs = quantize(x)
    np.testing.assert_array_equal(xs.view(np.int32),
                                  xq.reshape(4, -1, 16).sum(axis=-1, dtype=np.int64))


def test_q8_k_rounds_ties_to_even_and_uses_signed_max():
    x = np.zeros((1, 256), np.float32)
    x[0, 0] = -127.0  # signed max -127 -> iscale = 1 exactly, so x*iscale is x
    x[0, 1:9] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 3.49]
    x[0, 9] = 127.0  # same magnitude as x[0]: the first one found stays the max
    xq, xd, _ = quantize(x)
    assert xd[0, 0] == 1.0
    assert list(xq[0, :10]) == [-127, 0, 2, 2, 0, -2, -2, 126, 3, 127]


def test_q8_k_positive_max_maps_to_minus_127():
    x = np.linspace(-1.0, 2.0, 256, dtype=np.float32)[None, :]
    xq, xd, _ = quantize(x)
    assert xq[0, -1] == -127 and xd[0, 0] < 0
    np.testing.assert_allclose(xq[0] * xd[0, 0], x[0], atol=abs(xd[0, 0]) / 2 + 1e-7)


@pytest.mark.slow
def test_avx2_target_without_vnni(tmp_path: Path) -> None:
    """This machine runs the 512-bit VNNI path in-process; an AVX2 target (numba's own
    target variables) takes vpmaddubsw + vpmaddwd on 256-bit registers, one chunk at a time.
    (The portable IR runs in test_kernels_f16's generic-target test.)"""
    require(AVX2_TARGET)
    env = target_env(AVX2_TARGET, tmp_path)
    check = "from edgeinfer.kernels.isa import ISA; print(ISA.NAME)"
    flags = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True)
    assert flags.stdout.split() == ["avx2"], flags.stderr
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
           "dequantized_reference and (1-256 or 17-2048)"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
