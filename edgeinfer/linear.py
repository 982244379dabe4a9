"""Weight matrices and the matrix products of the forward pass.

A `Linear` is a zero-copy view of a GGUF tensor plus its registered quant format. `project`
multiplies one input by several weights that share it (q/k/v, gate/up): the activations are
converted to each needed vec_dot format once, into scratch buffers sized at load, and then
every weight's kernel runs on them.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, replace

import numpy as np
from numba import njit

from edgeinfer.kernels.registry import ActFormat, QuantFormat, quant_format


@dataclass(frozen=True)
class Linear:
    """y = W @ x for a GGUF weight of shape (n_out, n_in), kept in its quantized blocks."""

    name: str
    fmt: QuantFormat
    weight: np.ndarray  # (n_out, row_bytes) uint8: GGML blocks, or the floats' bytes
    n_out: int
    n_in: int

    @classmethod
    def from_tensor(cls, name: str, qtype: int, data: np.ndarray, shape: tuple[int, int]):
        """data: the tensor as the GGUF map holds it (uint8 blocks, or float rows)."""
        fmt = quant_format(qtype, name)
        rows = np.ascontiguousarray(data).view(np.uint8).reshape(shape[0], -1)
        return cls(name, fmt, rows, shape[0], shape[1])

    def rows(self, start: int, stop: int, name: str) -> Linear:
        """A zero-copy view of output rows [start, stop): splits fused qkv / gate_up."""
        return Linear(name, self.fmt, self.weight[start:stop], stop - start, self.n_in)

    def for_logits(self) -> Linear:
        """The same weights with the output head's kernel (QuantFormat.logits)."""
        return replace(self, fmt=self.fmt.for_logits)


def lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Private, page-aligned zeros whose memory becomes resident 4 KiB at a time, as a batch
    or the tokens reach it: the KV cache, the activation buffers and scratch, sized at load
    for the longest batch. numpy asks for 2 MiB transparent huge pages on large arrays, and
    a cache whose layers each take the first rows of their own huge page made a short run
    resident in all of them (+86 MB for SmolLM2 at 4096 tokens); and its smaller zeros come
    from the heap, written. Attention speed is the same on small pages."""
    n_bytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if n_bytes == 0:
        return np.zeros(shape, dtype)
    if hasattr(mmap, "MAP_PRIVATE"):  # Unix: anonymous (fd -1), private to this process
        buf = mmap.mmap(-1, n_bytes, flags=mmap.MAP_PRIVATE)
    else:
        buf = mmap.mmap(-1, n_bytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_NOHUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: nothing to avoid
            pass
    return np.frombuffer(buf, dtype).reshape(shape)


class ActScratch:
    """Preallocated buffers for the activations, shared by every vec_dot format."""

    def __init__(self, n_tokens: int, n_in_max: int):
        size = n_tokens * n_in_max
        # page-aligned (lazy_zeros): the kernels' 64-byte vector loads of a row never
        # straddle two cache lines, each of which costs two loads
        self.xq = lazy_zeros((size,), np.int8)
        self.xd = lazy_zeros((size // 16 + 1,), np.float32)
        self.xs = lazy_zeros((size // 16 + 1,), np.float32)
        self.xf = lazy_zeros((size,), np.float32)
        self._views: dict[tuple[str, int, int], tuple] = {}

    def views(self, act: ActFormat, n: int, n_in: int) -> tuple:
        """C-contiguous (n, ...) views of the flat buffers, so kernels see dense arrays; made
        once per (format, n, n_in): a decode step asks for the same few hundreds of times."""
        key = (act.name, n, n_in)
        bufs = self._views.get(key)
        if bufs is None:
            bufs = act_views(self.xq, self.xd, self.xs, self.xf, n, n_in, act.block,
                             act.sum_block)
            self._views[key] = bufs
        return bufs


@njit(cache=True, nogil=True)
def act_views(xq, xd, xs, xf, n, n_in, block, sum_block):
    """The flat scratch buffers as (n, ...) arrays of one activation format (block values
    per scale, sum_block per sum; 0: none); the layer loop cuts them the same way."""
    nd = n_in // block if block > 1 else 1
    ns = n_in // sum_block if sum_block else 1
    return (xq[: n * n_in].reshape((n, n_in)), xd[: n * nd].reshape((n, nd)),
            xs[: n * ns].reshape((n, ns)), xf[: n * n_in].reshape((n, n_in)))


def project(x: np.ndarray, linears: tuple[Linear, ...], outs: tuple[np.ndarray, ...],
            scratch: ActScratch) -> None:
    """outs[i] = x @ linears[i].T; x (n, n_in) f32 contiguous, outs[i] (n, n_out_i) f32.
    x is converted once per run of weights sharing an activation format (all formats share
    the scratch buffers, so a change of format converts again)."""
    n, n_in = x.shape
    current = None  # the format the scratch buffers hold x in
    for lin, out in zip(linears, outs):
        act = lin.fmt.act
        bufs = scratch.views(act, n, n_in)
        if act is not current:
            act.quantize(x, *bufs)
            current = act
        lin.fmt.matmul(lin.weight, *bufs, out)
