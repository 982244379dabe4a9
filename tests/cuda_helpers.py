"""Shared by the CUDA tests: skip without numba-cuda; Q8_1 activations as llama.cpp makes
them (ggml-quants.c quantize_row_q8_1_ref), written independently of the device kernel."""

from __future__ import annotations

import numpy as np
import pytest

cuda = pytest.importorskip("numba.cuda", reason="numba-cuda not installed (extra: cuda)")
if getattr(cuda, "implementation", None) != "NVIDIA":  # numba's deprecated built-in target
    pytest.skip("numba-cuda not installed (extra: cuda)", allow_module_level=True)


def q8_1_reference(x: np.ndarray):
    """(q int8 (n, n_in), d (n, nb), s (n, nb)) of x (n, n_in) f32, in float32 maths."""
    n, n_in = x.shape
    blocks = x.reshape(n, n_in // 32, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=2)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    v = blocks * inv[..., None]
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    s = (d * q.astype(np.int64).sum(axis=2)).astype(np.float32)
    return q.reshape(n, n_in), d, s


def rel_err(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))
