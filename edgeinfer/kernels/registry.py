"""Quant formats registered as data: GGML type -> block geometry, activation format, kernel.

Every weight matrix is kept as the GGUF stores it: a (n_out, row_bytes) uint8 view of the
memory map (F32/F16/BF16 rows too, which their kernels view as floats). A matrix product
first converts the float32 activations once into the weight type's "vec_dot" format, as
llama.cpp does (ggml-cpu.c: ggml_compute_forward_mul_mat), then runs an integer (or float)
block kernel.

Uniform kernel signature, so dispatch is one dict lookup:

    kernel(w, xq, xd, xs, xf, out) -> None
        w   (n_out, row_bytes) uint8   raw GGML blocks, or the bytes of F32/F16/BF16 rows
        xq  (n_tok, n_in)      int8    quantized activations (Q8_0 / Q8_1 / Q8_K formats)
        xd  (n_tok, n_in//32)  f32     Q8_0/Q8_1 block scales; Q8_K: (n_tok, n_in//256)
        xs  (n_tok, n_in//32)  f32     Q8_1: d*sum(q) per block; Q8_K: (n_tok, n_in//16) bsums,
                                       int32 values in the f32 buffer's bits; grouped Q8_0
                                       (AVX-512 VNNI; AVX2's logits format): int32 lane sums,
                                       (n_tok, n_in//16) or (n_tok, n_in//32) (GROUP_SUMS)
        xf  (n_tok, n_in)      f32     activations for float weight types (rounded to the
                                       weight's float type where llama.cpp rounds them)
        out (n_tok, n_out)     f32     written, never allocated

Activation quantizers share one signature too:

    quantizer(x, xq, xd, xs, xf) -> None      x (n_tok, n_in) f32
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edgeinfer.errors import EdgeInferError


@dataclass(frozen=True)
class ActFormat:
    """How activations are prepared for one family of weight types."""

    name: str  # "f32", "f16", "bf16", "q8_0", "q8_1", "q8_k"
    block: int  # values per scale in xd (1 for float formats)
    sum_block: int  # values per entry of xs (0 when unused)
    quantize: Callable


@dataclass(frozen=True)
class QuantFormat:
    qtype: GGMLQuantizationType
    act: ActFormat
    matmul: Callable
    # The output head's format, where it differs: a kernel that sums the blocks in another
    # order than llama.cpp's, faster, for a product whose results no later rounding depends
    # on (the logits). Inside the layers a changed rounding flips activation roundings
    # downstream and moves logits by up to ~1 on gemma-3; in the head it moves them by ulps.
    logits: QuantFormat | None = None

    @property
    def for_logits(self) -> QuantFormat:
        return self.logits or self

    @property
    def block_size(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][0]

    @property
    def type_size(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][1]


QUANT_FORMATS: dict[GGMLQuantizationType, QuantFormat] = {}


def register(qtype: GGMLQuantizationType, act: ActFormat, matmul: Callable,
             logits: tuple[ActFormat, Callable] | None = None) -> None:
    """The type's format; `logits`: (activation format, kernel) of its output-head variant."""
    head = QuantFormat(qtype, *logits) if logits else None
    QUANT_FORMATS[qtype] = QuantFormat(qtype, act, matmul, head)


def quant_format(qtype: GGMLQuantizationType | int, tensor_name: str = "?") -> QuantFormat:
    """The registered format for a type, or a clear error naming the tensor."""
    _load_all()
    try:
        return QUANT_FORMATS[GGMLQuantizationType(qtype)]
    except (KeyError, ValueError):
        name = getattr(GGMLQuantizationType, "_value2member_map_", {}).get(qtype, qtype)
        name = getattr(name, "name", str(qtype))
        supported = ", ".join(t.name for t in supported_types())
        raise EdgeInferError(
            f"tensor '{tensor_name}' has unsupported quant type {name} (supported: {supported})"
        ) from None


def supported_types() -> list[GGMLQuantizationType]:
    _load_all()
    return sorted(QUANT_FORMATS, key=int)


_loaded = False


def _load_all() -> None:
    """Import the kernel modules (they register themselves) only when first needed, so that
    `edgeinfer --help` never imports numba."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from edgeinfer.kernels import floats, kquants, legacy  # noqa: F401
