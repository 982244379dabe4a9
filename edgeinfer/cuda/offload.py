"""The offloaded layers: the last layers of the model (and the output head, with -ngl past
n_layer) with their weights, KV cache and activations on one CUDA device.

`DeviceLayers.forward` takes the residual stream of a batch from the CPU layers (one copy
in), runs each device layer as ~11 kernel launches and returns either the logits of the
wanted rows or the residual stream (one copy out). Weights are copied once, at load, in
their GGML blocks; the q/k/v and gate/up matrices of one type are stacked into one device
matrix so that each pair or triple is one launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

from edgeinfer.cuda.kernels import attention as attn_k
from edgeinfer.cuda.kernels import matmul as mm
from edgeinfer.cuda.kernels import norms
from edgeinfer.cuda.kernels.registry import cuda_format, device_rows

LOGIT_ROWS = 32  # head rows per pass: the device logits buffer is (32, n_vocab)
_MATMULS: dict = {}  # qtype -> compiled matmul kernel


def matmul_kernel(fmt):
    if fmt.qtype not in _MATMULS:
        _MATMULS[fmt.qtype] = mm.make_matmul(fmt.dot32)
    return _MATMULS[fmt.qtype]


@dataclass
class Product:
    """One launch: a device matrix (rows of one or more stacked linears of one type)
    writing columns [col0, col0 + n_out) of an output buffer."""

    weight: object  # device array
    bias: object  # device f32 (n_out,), or size 0
    fmt: object  # CudaFormat
    col0: int
    n_out: int
    n_in: int


def products(linears, biases) -> list[Product]:
    """Runs of consecutive linears of one type stacked into one device matrix each."""
    out, col = [], 0
    i = 0
    while i < len(linears):
        j = i
        while j + 1 < len(linears) and linears[j + 1].fmt.qtype == linears[i].fmt.qtype:
            j += 1
        run, run_bias = linears[i : j + 1], biases[i : j + 1]
        fmt = cuda_format(run[0].fmt.qtype, run[0].name)
        rows = np.concatenate([lin.weight for lin in run]) if len(run) > 1 else run[0].weight
        host = device_rows(fmt, rows, run[0].n_in)
        n_out = sum(lin.n_out for lin in run)
        if all(b is None for b in run_bias):
            bias = np.zeros(0, np.float32)
        else:
            bias = np.concatenate([np.zeros(lin.n_out, np.float32) if b is None else b
                                   for lin, b in zip(run, run_bias)]).astype(np.float32)
        out.append(Product(cuda.to_device(host), cuda.to_device(bias), fmt, col, n_out,
                           run[0].n_in))
        col += n_out
        i = j + 1
    return out


def _runs(qtypes) -> int:
    """Launches of a list of linears: one per run of consecutive equal types."""
    return sum(1 for i, q in enumerate(qtypes) if i == 0 or q != qtypes[i - 1])


def launches_per_step(blocks, head: bool, head_dim: int) -> int:
    """Kernel launches of one forward of the device layers `blocks` (and the head): per
    layer the products plus rope_store, attention (with its output's quantization when
    head_dim is a multiple of 32, else one more launch), two add_norm_quant and glu_quant;
    one more add_norm_quant before the first layer and one before the head."""
    n = 1
    for b in blocks:
        n += sum(_runs([lin.fmt.qtype for lin in group]) for group in (
            (b.attn_q, b.attn_k, b.attn_v), (b.attn_output,), (b.ffn_gate, b.ffn_up),
            (b.ffn_down,)))
        n += 5 if head_dim % mm.QBLOCK == 0 else 6
    return n + (2 if head else 0)


def _vec(v):
    """A weight vector on the device; an absent one (None) as size 0."""
    return cuda.to_device(np.zeros(0, np.float32) if v is None
                          else np.ascontiguousarray(v, np.float32))


@dataclass
class DeviceLayer:
    attn_norm: object
    ffn_norm: object
    post_attention_norm: object
    post_ffw_norm: object
    q_norm: object
    k_norm: object
    qkv: list[Product]
    output: list[Product]
    gate_up: list[Product]
    down: list[Product]
    local: bool  # sliding-window layer

    @classmethod
    def load(cls, b, local: bool) -> DeviceLayer:
        return cls(_vec(b.attn_norm), _vec(b.ffn_norm), _vec(b.post_attention_norm),
                   _vec(b.post_ffw_norm), _vec(b.attn_q_norm), _vec(b.attn_k_norm),
                   products([b.attn_q, b.attn_k, b.attn_v],
                            [b.attn_q_bias, b.attn_k_bias, b.attn_v_bias]),
                   products([b.attn_output], [b.attn_output_bias]),
                   products([b.ffn_gate, b.ffn_up], [None, None]),
                   products([b.ffn_down], [None]), local)


class DeviceCache:
    """K and V of the offloaded layers, (n_blocks, L, n_kv, B, hd) float16 each: the same
    blocks as the host cache (model.KVCache), reached through the same tables."""

    def __init__(self, n_blocks: int, n_layer: int, n_kv: int, block: int, hd: int):
        shape = (n_blocks, n_layer, n_kv, block, hd)
        self.k, self.v = cuda.device_array(shape, np.float16), cuda.device_array(shape, np.float16)

    def copy_rows(self, src: int, dst: int, n_rows: int) -> None:
        """Block src's rows into block dst (all of them: rows past n_rows are never read
        before they are written)."""
        self.k[dst].copy_to_device(self.k[src])
        self.v[dst].copy_to_device(self.v[src])

    def block_bytes(self) -> int:
        _, n_layer, n_kv, block, hd = self.k.shape
        return 2 * n_layer * n_kv * block * hd * 2

    def read(self, blocks: list[int], n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """Cells 0..n_tokens-1 held by blocks, in order, (L, n_kv, n_tokens, hd) K and V."""
        return tuple(np.concatenate([cache[b].copy_to_host() for b in blocks],
                                    axis=2)[:, :, :n_tokens].copy()
                     for cache in (self.k, self.v))

    def write(self, blocks: list[int], saved, n_tokens: int) -> None:
        block = self.k.shape[3]
        for cache, part in zip((self.k, self.v), saved):
            for i, b in enumerate(blocks):
                whole = cache[b].copy_to_host()
                rows = min(block, n_tokens - i * block)
                whole[:, :, :rows] = part[:, :, i * block : i * block + rows]
                cache[b].copy_to_device(whole)


class DeviceLayers:
    """Layers first .. n_layer-1 of a model on the current CUDA device, and its output head
    when `head`."""

    def __init__(self, config, weights, numerics, first: int, head: bool, n_ctx: int,
                 n_slots: int, n_batch: int, kv_blocks: int = 0):
        c = config
        self.config, self.head = c, head
        self.eps = np.float32(c.norm_eps)
        self.numerics = numerics
        self.layers = [DeviceLayer.load(b, bool(c.swa_layers[first + i]))
                       for i, b in enumerate(weights.blocks[first:])]
        n_dev = len(self.layers)
        from edgeinfer.model import block_size

        block = block_size(n_ctx)
        per = -(-n_ctx // block)
        self.cache = DeviceCache(kv_blocks or n_slots * per, n_dev, c.n_head_kv, block,
                                 c.head_dim)
        self.tables = cuda.device_array((n_slots, per), np.int32)
        self.rope = {False: (cuda.to_device(numerics.cos), cuda.to_device(numerics.sin)),
                     True: (cuda.to_device(numerics.cos_local),
                            cuda.to_device(numerics.sin_local))}
        self.output = products([weights.output], [None]) if head else []
        self.output_norm = _vec(weights.output_norm)
        self.buffers = DeviceBuffers(c, n_batch, LOGIT_ROWS if head else 0)
        self.launches = 0  # kernel launches so far (forward counts them)
        # the simulator runs a Python thread per GPU thread: few blocks, few threads; its
        # barriers wait for threads that wait for the GIL, ~5x faster at a 0.5 ms switch
        self.simulated = bool(cuda.config.ENABLE_CUDASIM)
        if self.simulated:
            import sys

            sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
        self.max_blocks = 1 if self.simulated else 1 << 16
        self.nt = mm.WARP if self.simulated else norms.NT

    def _go(self, kernel, grid, block, *args) -> None:
        self.launches += 1
        kernel[grid, block](*args)

    def _product(self, prods, x, n, out) -> None:
        """out[:n] = x[:n] @ W.T for the products (x f32 (n, n_in); its Q8_1 blocks already
        in the activation buffers)."""
        b = self.buffers
        for p in prods:
            n_in = p.n_in
            grid, block = mm.matmul_grid(p.n_out, n, self.max_blocks)
            self._go(matmul_kernel(p.fmt), grid, block, p.weight, b.xq[:n, : n_in // 4],
                     b.xd[:n, : n_in // 32], b.xs[:n, : n_in // 32], x[:n], p.bias, out[:n],
                     p.col0, n)

    def forward(self, x_host, positions, slots, tables, rows, logits) -> bool:
        """The device layers on x_host (n, n_embd), in place, the cache reached through
        tables (the host's, copied in); with the head, logits of `rows` into logits
        (m, n_vocab) and True; else the new x_host and False."""
        n, b, c, const = len(x_host), self.buffers, self.config, self.numerics
        b.x[:n].copy_to_device(x_host)
        b.positions[:n].copy_to_device(positions)
        b.slots[:n].copy_to_device(slots)
        self.tables.copy_to_device(tables)
        x = b.x[:n]
        nothing = b.no_rows
        # h = rms_norm(x) * attn_norm of the first device layer, and its Q8_1 blocks
        self._go(norms.add_norm_quant, n, self.nt, x, nothing, b.none,
                 self.layers[0].attn_norm, self.eps, b.every_row, b.h, b.xq, b.xd, b.xs)
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = self.cache.k[:, i], self.cache.v[:, i]  # (blocks, n_kv, B, hd)
            cos, sin = self.rope[layer.local]
            window = const.window if layer.local else 0
            # attention: x += Wo . attention(rope(norm(Wq h)), rope(norm(Wk h)), Wv h)
            self._product(layer.qkv, b.h, n, b.qkv)  # (n, (n_head + 2 n_kv) hd)
            self._go(attn_k.rope_store, (c.n_head + c.n_head_kv, n), mm.WARP, b.qkv[:n],
                     layer.q_norm, layer.k_norm, self.eps, cos, sin, const.rope_neox,
                     c.n_rot, np.float32(const.q_scale), b.positions[:n], b.slots[:n],
                     self.tables, b.q[:n], b.k[:n], k_cache, v_cache)  # q (n, n_head, hd)
            fused = c.head_dim % mm.QBLOCK == 0  # attention writes the Q8_1 blocks too
            self._go(attn_k.attention, (c.n_head, n), mm.WARP, b.q[:n], k_cache, v_cache,
                     b.slots[:n], self.tables, b.positions[:n], window, const.score_scale,
                     b.attn[:n],
                     *((b.xq, b.xd, b.xs) if fused else b.no_blocks))
            if not fused:
                grid, block = mm.quantize_grid(n, b.attn.shape[1])
                self._go(mm.quantize_q8_1, grid, block, b.attn[:n], b.xq, b.xd, b.xs, n)
            self._product(layer.output, b.attn, n, b.o)  # (n, n_embd)
            self._go(norms.add_norm_quant, n, self.nt, x, b.o[:n], layer.post_attention_norm,
                     layer.ffn_norm, self.eps, b.every_row, b.h, b.xq, b.xd, b.xs)
            # feed-forward: x += W_down . (act(W_gate h) * W_up h)
            self._product(layer.gate_up, b.h, n, b.gate_up)  # (n, 2 n_ff)
            self._go(norms.glu_quant, n, self.nt, b.gate_up[:n], const.gelu, b.act[:n],
                     b.xq, b.xd, b.xs)  # (n, n_ff)
            self._product(layer.down, b.act, n, b.o)  # (n, n_embd)
            last = i == len(self.layers) - 1
            next_norm = b.none if last else self.layers[i + 1].attn_norm
            self._go(norms.add_norm_quant, n, self.nt, x, b.o[:n], layer.post_ffw_norm,
                     next_norm, self.eps, b.every_row, b.h, b.xq, b.xd, b.xs)
        if not self.head:
            x.copy_to_host(x_host)
            return False
        self._head(x, rows, logits)
        return True

    def _head(self, x, rows, logits) -> None:
        """logits = rms_norm(x[rows]) * output_norm @ output.T, LOGIT_ROWS rows at a time."""
        b = self.buffers
        for r0 in range(0, len(rows), LOGIT_ROWS):
            m = min(LOGIT_ROWS, len(rows) - r0)
            b.rows[:m].copy_to_device(np.ascontiguousarray(rows[r0 : r0 + m], np.int32))
            self._go(norms.add_norm_quant, m, self.nt, x, b.no_rows, b.none,
                     self.output_norm, self.eps, b.rows, b.h, b.xq, b.xd, b.xs)
            self._product(self.output, b.h, m, b.logits)
            b.logits[:m].copy_to_host(logits[r0 : r0 + m])


class DeviceBuffers:
    """The device activations of up to n_batch tokens, allocated once at load."""

    def __init__(self, c, n_batch: int, logit_rows: int):
        def f32(*shape):
            return cuda.device_array(shape, np.float32)

        n = max(n_batch, logit_rows)
        n_in = max(c.n_embd, c.n_head * c.head_dim, c.n_ff)
        self.x, self.h, self.o = f32(n, c.n_embd), f32(n, c.n_embd), f32(n, c.n_embd)
        self.qkv = f32(n, (c.n_head + 2 * c.n_head_kv) * c.head_dim)
        self.q = f32(n, c.n_head, c.head_dim)
        self.k = f32(n, c.n_head_kv, c.head_dim)
        self.attn = f32(n, c.n_head * c.head_dim)
        self.gate_up, self.act = f32(n, 2 * c.n_ff), f32(n, c.n_ff)
        self.xq = cuda.device_array((n, n_in // 4), np.int32)
        self.xd, self.xs = f32(n, n_in // 32), f32(n, n_in // 32)
        self.positions, self.slots, self.rows = (cuda.device_array(n, np.int32)
                                                 for _ in range(3))
        self.logits = f32(logit_rows, c.n_vocab)
        self.every_row = cuda.to_device(np.arange(n, dtype=np.int32))  # rows as they are
        self.no_blocks = (cuda.to_device(np.zeros((0, 1), np.int32)),  # attention: do not
                          cuda.to_device(np.zeros((0, 1), np.float32)),  # quantize
                          cuda.to_device(np.zeros((0, 1), np.float32)))
        self.none = cuda.to_device(np.zeros(0, np.float32))  # an absent norm weight
        self.no_rows = cuda.to_device(np.zeros((0, c.n_embd), np.float32))  # no residual
