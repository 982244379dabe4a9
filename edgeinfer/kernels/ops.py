"""Element-wise and per-row kernels of the forward pass: norms, rope, activations, embedding.

They run serially below PARALLEL_ROWS rows: they touch a few KB per token, and a Numba
parallel region costs microseconds of fork/join per call, more than
the work itself at decode time; prefill batches split their rows across threads, and so do
decode batches of the costlier activations (parallel_rows, by values). Each
mirrors the ggml CPU op named in its docstring,
including where ggml accumulates in double or rounds to F16, so our logits track
llama.cpp's. Kernels write into `out` arguments and never allocate.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from edgeinfer.kernels.expf import expf
from edgeinfer.kernels.f16 import f16_bits_to_f32, f32_to_f16_bits

PARALLEL_ROWS = 32  # batches at least this long run the row loops on all threads
# Below PARALLEL_ROWS the activations, whose values cost more, split 2+ rows across the
# threads from this many values (rows x columns); swiglu's loop vectorizes, so it needs more.
# The norms lose at 8-16 rows and keep PARALLEL_ROWS (docs/performance.md, Kernels).
GEGLU_PARALLEL_VALUES = 4096
SWIGLU_PARALLEL_VALUES = 12288


@njit(cache=True, nogil=True, inline="always")
def _rms_scale(x, eps, i):
    """ggml: f32 squares summed in double (one running sum there; four here, which breaks
    the 4-cycle dependency chain that made this the slowest small op of a prefill; the double
    sums agree far below the f32 rounding of the mean)."""
    n = x.shape[1]
    a0 = a1 = a2 = a3 = 0.0
    for j in range(0, n - n % 4, 4):
        a0 += np.float64(x[i, j] * x[i, j])
        a1 += np.float64(x[i, j + 1] * x[i, j + 1])
        a2 += np.float64(x[i, j + 2] * x[i, j + 2])
        a3 += np.float64(x[i, j + 3] * x[i, j + 3])
    for j in range(n - n % 4, n):
        a0 += np.float64(x[i, j] * x[i, j])
    acc = (a0 + a1) + (a2 + a3)
    return np.float32(1.0) / np.sqrt(np.float32(acc / n) + np.float32(eps))


# Element-wise loops vectorize behind a run-time check that the output overlaps no input;
# an aliased output fails it and runs scalar. So x and out are distinct here, and in-place
# normalization (q/k norms) has its own loop, whose same-index store needs no check.
@njit(cache=True, nogil=True, inline="always")
def _rms_row(x, weight, eps, out, i):
    scale = _rms_scale(x, eps, i)
    for j in range(x.shape[1]):
        out[i, j] = x[i, j] * scale * weight[j]


@njit(cache=True, nogil=True, inline="always")
def _rms_row_inplace(x, weight, eps, i):
    scale = _rms_scale(x, eps, i)
    for j in range(x.shape[1]):
        x[i, j] = x[i, j] * scale * weight[j]


@njit(cache=True, nogil=True)
def _rms_norm_serial(x, weight, eps, out):
    for i in range(x.shape[0]):
        _rms_row(x, weight, eps, out, i)


@njit(cache=True, nogil=True, parallel=True)
def _rms_norm_parallel(x, weight, eps, out):
    for i in prange(x.shape[0]):
        _rms_row(x, weight, eps, out, i)


@njit(cache=True, nogil=True)
def _rms_norm_inplace_serial(x, weight, eps):
    for i in range(x.shape[0]):
        _rms_row_inplace(x, weight, eps, i)


@njit(cache=True, nogil=True, parallel=True)
def _rms_norm_inplace_parallel(x, weight, eps):
    for i in prange(x.shape[0]):
        _rms_row_inplace(x, weight, eps, i)


def rms_norm(x, weight, eps, out):
    """ggml_compute_forward_rms_norm_f32 then mul: squares summed in double, f32 scale.

    x, out (n, dim) f32, apart (see above); weight (dim,) f32.
    """
    by_rows(ROW_KERNELS["rms_norm"], len(x))(x, weight, eps, out)


def rope_table(n_ctx: int, n_rot: int, base: float, freq_scale: float,
               factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables (n_ctx, n_rot/2) f32, built as ggml_rope_cache_init does: the angle of
    pair i is pos * s^i with s = powf(base, -2/n_rot) accumulated as a running f32 product
    (not base**(-2i/d) per i, which differs in the last bits), divided by the optional
    frequency factor and scaled by freq_scale."""
    half = n_rot // 2
    theta_scale = np.float32(base) ** np.float32(-2.0 / n_rot)
    theta = np.empty((n_ctx, half), dtype=np.float32)
    theta[:, 0] = np.arange(n_ctx, dtype=np.float32)
    for i in range(1, half):
        theta[:, i] = theta[:, i - 1] * theta_scale
    if factors is not None:
        theta /= factors.astype(np.float32)[None, :]
    theta *= np.float32(freq_scale)
    return np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)


@njit(cache=True, nogil=True)
def rope(x, positions, cos, sin, neox):
    """In-place rotary embedding of x (n, n_heads, head_dim) at absolute positions (n,).

    neox=False (llama, "NORM"): rotate adjacent pairs (2i, 2i+1); the converter permuted
    Q/K rows so this equals HF's rotate_half. neox=True (qwen2/3, gemma3, phi3): rotate
    (i, i + n_rot/2). Dims at and past n_rot pass through (phi3 partial rotary).
    """
    n, n_heads, _ = x.shape
    half = cos.shape[1]
    for t in range(n * n_heads):
        i, h = t // n_heads, t % n_heads
        p = positions[i]
        for k in range(half):
            c, s = cos[p, k], sin[p, k]
            a = 2 * k if not neox else k
            b = a + 1 if not neox else k + half
            x0, x1 = x[i, h, a], x[i, h, b]
            x[i, h, a] = x0 * c - x1 * s
            x[i, h, b] = x0 * s + x1 * c


@njit(cache=True, nogil=True, inline="always")
def _swiglu_row(gate, up, out, i):
    """ggml_v_silu(g) * up: g / (1 + expf(-g)) with ggml's own expf (its AVX-512 build's, bit
    for bit where n_ff is a multiple of 16; ggml's tail takes libm's), which also lets the
    loop vectorize (libm's expf does not)."""
    for j in range(gate.shape[1]):
        g = gate[i, j]
        out[i, j] = g / (np.float32(1.0) + expf(-g)) * up[i, j]


# error_model="numpy": no zero-division check, whose branch would keep the loop scalar
@njit(cache=True, nogil=True, error_model="numpy")
def _swiglu_serial(gate, up, out):
    for i in range(gate.shape[0]):
        _swiglu_row(gate, up, out, i)


@njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def _swiglu_parallel(gate, up, out):
    for i in prange(gate.shape[0]):
        _swiglu_row(gate, up, out, i)


def swiglu(gate, up, out):
    """silu(gate) * up in f32 (ggml_vec_swiglu_f32). All (n, n_ff)."""
    by_rows(ROW_KERNELS["swiglu"], len(gate), gate.size, SWIGLU_PARALLEL_VALUES)(gate, up, out)


def _gelu_table() -> np.ndarray:
    """ggml's GELU table (GGML_GELU_FP16): for every F16 input, F16 of the tanh form
    computed in f32, stored as f32 for the lookup."""
    with np.errstate(all="ignore"):  # the NaN patterns (ARM flags signalling ones)
        x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
        x = x.astype(np.float32)
        inner = np.float32(0.7978845608028654) * x * (1 + np.float32(0.044715) * x * x)
        y = np.float32(0.5) * x * (1 + np.tanh(inner, dtype=np.float32))
    return y.astype(np.float16).astype(np.float32)


GELU_TABLE = _gelu_table()


@njit(cache=True, nogil=True, inline="always")
def _geglu_row(gate, up, table, out, i):
    for j in range(gate.shape[1]):
        x = gate[i, j]
        if x <= -10.0:
            g = np.float32(0.0)
        elif x >= 10.0:
            g = x
        else:
            g = table[f32_to_f16_bits(x)]
        out[i, j] = g * up[i, j]


@njit(cache=True, nogil=True)
def _geglu_serial(gate, up, table, out):
    for i in range(gate.shape[0]):
        _geglu_row(gate, up, table, out, i)


@njit(cache=True, nogil=True, parallel=True)
def _geglu_parallel(gate, up, table, out):
    for i in prange(gate.shape[0]):
        _geglu_row(gate, up, table, out, i)


def geglu(gate, up, table, out):
    """gelu_tanh(gate) * up (ggml_vec_geglu_f32): 0 below -10, identity above 10, else
    the table entry of f16(x), times up in f32. gemma3's FFN. table = GELU_TABLE."""
    by_rows(ROW_KERNELS["geglu"], len(gate), gate.size, GEGLU_PARALLEL_VALUES)(
        gate, up, table, out)


# The row-wise kernels, (serial, parallel): one thread below PARALLEL_ROWS rows, where waking
# the others costs more than it saves. The layer loop picks by address (layers.Kernels).
ROW_KERNELS = {
    "rms_norm": (_rms_norm_serial, _rms_norm_parallel),
    "rms_norm_inplace": (_rms_norm_inplace_serial, _rms_norm_inplace_parallel),
    "swiglu": (_swiglu_serial, _swiglu_parallel),
    "geglu": (_geglu_serial, _geglu_parallel),
}


@njit(cache=True, nogil=True)
def parallel_rows(n_rows, n_values, min_values):
    """Whether a row loop over n_rows rows (n_values values in all) runs on all threads:
    from PARALLEL_ROWS rows, or 2 rows and min_values values (0: rows only)."""
    return n_rows >= PARALLEL_ROWS or (n_rows >= 2 and 0 < min_values <= n_values)


def by_rows(kernels: tuple, n_rows: int, n_values: int = 0, min_values: int = 0):
    """The serial or parallel one of a ROW_KERNELS pair, for n_rows rows (parallel_rows, as
    plain Python: a decode step makes few compiled calls from Python, tests/test_native)."""
    return kernels[parallel_rows.py_func(n_rows, n_values, min_values)]


@njit(cache=True, nogil=True)
def add_inplace(x, y):
    """x += y, both (n, dim) f32: residual connections."""
    n, dim = x.shape
    for i in range(n):
        for j in range(dim):
            x[i, j] += y[i, j]


@njit(cache=True, nogil=True)
def add_bias(x, bias):
    """x += bias broadcast over rows; bias (dim,) f32."""
    n, dim = x.shape
    for i in range(n):
        for j in range(dim):
            x[i, j] += bias[j]


@njit(cache=True, nogil=True)
def scale_inplace(x, factor):
    """x *= factor (f32): gemma3's sqrt(n_embd) embedding scale, phi3/gemma3 query scale."""
    flat = x.reshape(-1)
    f = np.float32(factor)
    for i in range(flat.size):
        flat[i] *= f


@njit(cache=True, nogil=True)
def softcap(x, cap):
    """x = cap * tanh(x / cap): gemma's optional final logit soft-capping."""
    flat = x.reshape(-1)
    c = np.float32(cap)
    for i in range(flat.size):
        flat[i] = c * np.float32(math.tanh(flat[i] / c))


@njit(cache=True, nogil=True)
def embed_q8_0(table, tokens, out):
    """Rows of a Q8_0 embedding table (n_vocab, row_bytes), dequantized exactly to f32."""
    dim = out.shape[1]
    for i in range(tokens.shape[0]):
        row = table[tokens[i]]
        for b in range(dim // 32):
            base = b * 34
            d = f16_bits_to_f32(np.uint16(row[base]) | (np.uint16(row[base + 1]) << 8))
            for j in range(32):
                q = np.int8(row[base + 2 + j])
                out[i, b * 32 + j] = d * np.float32(q)


@njit(cache=True, nogil=True)
def embed_f16(table, tokens, out):
    """Rows of an F16 (uint16 bits) embedding table, converted to f32."""
    for i in range(tokens.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = f16_bits_to_f32(table[tokens[i], j])
