"""ggml's vectorized exp and the SwiGLU built on it, bit for bit against a numpy transcript
of the AVX-512 build's ggml_v_expf / ggml_v_silu (ggml-cpu/vec.h); GeGLU against a float64
gelu_tanh; both on one thread and on all."""

from __future__ import annotations

import numpy as np

from edgeinfer.kernels import ops
from edgeinfer.kernels.expf import expf


def ggml_expf(x):
    """ggml_v_expf in numpy: an f32 fma is an exact f64 product plus one f64 add, rounded to
    f32 (double rounding cannot matter at these magnitudes); _mm512_scalef_ps is ldexp, and
    |n| > 192 gives inf above, 0 below."""
    f32, h = np.float32, lambda text: np.float32(float.fromhex(text))

    def fma(a, b, c):
        return (np.float64(a) * np.float64(b) + np.float64(c)).astype(f32)

    with np.errstate(over="ignore", invalid="ignore"):  # the inf inputs and outputs
        shifter = h("0x1.8p23")
        z = fma(x, h("0x1.715476p+0"), shifter)
        n = (z - shifter).astype(f32)
        b = fma(-n, h("0x1.7f7d1cp-20"), fma(-n, h("0x1.62e4p-1"), x))
        u = (b * b).astype(f32)
        j = fma(fma(fma(h("0x1.0e4020p-7"), b, h("0x1.573e2ep-5")), u,
                    fma(h("0x1.555e66p-3"), b, h("0x1.fffdb6p-2"))),
                u, fma(h("0x1.ffffecp-1"), b, f32(1.0)))
        scaled = np.ldexp(j, np.clip(n, -300, 300).astype(np.int32)).astype(f32)
    return np.where(np.abs(n) > 192, np.where(n > 0, f32(np.inf), f32(0)), scaled)


def test_expf_is_ggml_bit_for_bit():
    """llama.cpp's softmax exponentiates with ggml_v_expf (P is rounded to F16 right after,
    so its exact bits decide P's), and so does its SiLU, on both signs; NaN stays NaN."""
    rng = np.random.default_rng(0)
    mags = np.concatenate([np.geomspace(1e-9, 87.3, 20000), rng.uniform(0, 20, 20000), [0.0]])
    edges = [88.0, 88.3, 88.5, 88.7, 88.72, 88.8, 100.0, 133.0, 133.8, -133.8, 1e30, np.inf,
             np.nan]  # n = 127, 128, 129+, 192 and past (both signs), NaN
    x = np.concatenate([-mags, mags, edges])
    x = x.astype(np.float32)
    ours = np.array([expf(t) for t in x])
    np.testing.assert_array_equal(ours, ggml_expf(x))
    finite = np.abs(x) < 87  # NaN compares False
    np.testing.assert_allclose(ours[finite], np.exp(x[finite].astype(np.float64)), rtol=3e-7)
    tiny = [expf(np.float32(t)) for t in (-88.0, -100.0, -133.0, -150.0, -1e30, -np.inf)]
    tiny = np.array(tiny)
    assert (tiny < 2e-38).all()  # below F16's range: P rounds to 0 as with ggml's


def test_swiglu_is_ggml_bit_for_bit():
    """ggml_vec_swiglu_f32: g / (1 + expf(-g)) * up, in f32, for decode rows and for batches
    long enough to run on all threads."""
    rng = np.random.default_rng(1)
    for n in (1, 3, 9, ops.PARALLEL_ROWS + 1):  # 9 x 1536: on all threads by its values
        gate = (rng.standard_normal((n, 1536)) * 8).astype(np.float32)
        gate[0, :4] = [-100.0, 100.0, 0.0, -0.0]
        up = rng.standard_normal((n, 1536)).astype(np.float32)
        out = np.empty_like(gate)
        ops.swiglu(gate, up, out)
        silu = (gate / (np.float32(1) + ggml_expf(-gate))).astype(np.float32)
        np.testing.assert_array_equal(out, silu * up)


def test_geglu_matches_gelu_tanh_of_f16_inputs():
    """ggml_vec_geglu_f32: gelu_tanh looked up at f16(x) (an f16 result), 0 below -10, x
    above 10, times up; one row, rows on one thread and rows split across threads by their
    values (ops.parallel_rows) give the same."""
    rng = np.random.default_rng(4)
    for n in (1, 2, 3, ops.PARALLEL_ROWS + 1):
        assert ops.parallel_rows(n, n * 2048, ops.GEGLU_PARALLEL_VALUES) == (n >= 2)
        gate = (rng.standard_normal((n, 2048)) * 4).astype(np.float32)
        gate[0, :4] = [-12.0, 12.0, 0.0, -10.0]
        up = rng.standard_normal((n, 2048)).astype(np.float32)
        out = np.empty_like(gate)
        ops.geglu(gate, up, ops.GELU_TABLE, out)
        x = gate.astype(np.float16).astype(np.float64)
        gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x)))
        gelu = np.where(gate <= -10, 0.0, np.where(gate >= 10, gate, gelu))
        np.testing.assert_allclose(out, gelu.astype(np.float16).astype(np.float32) * up,
                                   rtol=2e-3, atol=1e-6)
        assert out[0, 0] == 0 and out[0, 1] == np.float32(12.0) * up[0, 1]


def test_parallel_rows_rule():
    assert ops.parallel_rows(ops.PARALLEL_ROWS, 0, 0)  # rows alone
    assert not ops.parallel_rows(ops.PARALLEL_ROWS - 1, 10**9, 0)  # 0: rows only
    assert ops.parallel_rows(2, 4096, 4096) and not ops.parallel_rows(2, 4095, 4096)
    assert not ops.parallel_rows(1, 10**9, 4096)  # one row stays on one thread
