"""Weight types the CUDA path runs, registered as data: GGML type -> the device dot of one
32-value unit and how the weight travels to the device (raw GGML blocks, or typed floats).
Every type the CPU runs is here; dispatch is one dict lookup (`cuda_format`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from edgeinfer.cuda.kernels import floats, kquants, legacy
from edgeinfer.errors import EdgeInferError


@dataclass(frozen=True)
class CudaFormat:
    qtype: Q
    dot32: Callable  # dot32(w, row, u, xq, xd, xs, xf, t) -> float32
    dtype: np.dtype  # the device array's element type (uint8: GGML blocks)
    quantized: bool  # reads the Q8_1 activations (else the float ones)


def _q(qtype, dot):
    return CudaFormat(qtype, dot, np.dtype(np.uint8), True)


CUDA_FORMATS: dict[Q, CudaFormat] = {f.qtype: f for f in (
    CudaFormat(Q.F32, floats.dot_f32, np.dtype(np.float32), False),
    CudaFormat(Q.F16, floats.dot_f16, np.dtype(np.float16), False),
    CudaFormat(Q.BF16, floats.dot_bf16, np.dtype(np.uint16), False),
    _q(Q.Q8_0, legacy.dot_q8_0), _q(Q.Q4_0, legacy.dot_q4_0), _q(Q.Q4_1, legacy.dot_q4_1),
    _q(Q.Q5_0, legacy.dot_q5_0), _q(Q.Q5_1, legacy.dot_q5_1),
    _q(Q.Q2_K, kquants.dot_q2_k), _q(Q.Q3_K, kquants.dot_q3_k), _q(Q.Q4_K, kquants.dot_q4_k),
    _q(Q.Q5_K, kquants.dot_q5_k), _q(Q.Q6_K, kquants.dot_q6_k),
)}


def cuda_format(qtype: int, tensor: str) -> CudaFormat:
    try:
        return CUDA_FORMATS[Q(qtype)]
    except (KeyError, ValueError):
        raise EdgeInferError(f"tensor '{tensor}': type {qtype} has no CUDA kernel") from None


def device_rows(fmt: CudaFormat, rows: np.ndarray, n_in: int) -> np.ndarray:
    """The host rows (n_out, row_bytes) uint8 as the array the device kernels read."""
    if fmt.dtype == np.uint8:
        return np.ascontiguousarray(rows)
    return np.ascontiguousarray(rows).view(fmt.dtype).reshape(rows.shape[0], n_in)
