"""The transformer forward pass, shared by every registered architecture.

`Transformer.forward` takes a batch of tokens, each with its own absolute position and KV
cache slot, so one call is a prompt prefill (one slot, consecutive positions), a batched
decode step (one token for each of several slots), or any mix: the server's continuous
batching stands on it. Here: the embedding, one compiled call through every layer
(layers.run_layers), the output head. All buffers and the F16 KV cache are allocated once,
at load.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.config import ModelConfig
from edgeinfer.errors import EdgeInferError
from edgeinfer.kernels import ops
from edgeinfer.kernels.attention import KEY_BLOCK, scratch_floats, shared_floats
from edgeinfer.kernels.flash import flash_scratch_floats
from edgeinfer.layers import (
    LINEARS,
    PAD_TO,
    Buffers,
    kernels,
    layer_table,
    numerics,
    product_rows,
    run_layers,
)
from edgeinfer.linear import ActScratch, lazy_zeros, project
from edgeinfer.weights import Weights

KV_BLOCK = KEY_BLOCK  # cells per KV cache block (a key block never straddles two)


class KVCache:
    """F16 keys and values (stored as uint16 bits) for every layer: the CPU layers' here, the
    offloaded layers' on the device (`device`, cuda/offload.py's DeviceCache, the same blocks).

    A layer's cache is a pool of blocks of B cells, indexed (n_layer, n_blocks, B, n_kv, hd)
    as the kernels see them, and each sequence slot reaches its cells through its row of
    `tables`: cell p of slot s is row p % B of block tables[s, p // B]. `allocate` gives each
    slot its own blocks, in order (run, bench, the API); the server's pool (n_blocks given)
    starts with empty tables and hands blocks out through edgeinfer/kv/, shared between
    sequences by reference. Stored head by head, (n_layer, n_blocks, n_kv, B, hd): attention
    reads one KV head's rows of a block, which are then one contiguous run that the hardware
    prefetcher streams, where rows interleaved with the other heads' were a strided walk
    (docs/performance.md, "Head-major KV cache")."""

    def __init__(self, k: np.ndarray, v: np.ndarray, tables: np.ndarray | None = None,
                 device=None):
        if tables is None:  # one block per slot
            tables = np.arange(k.shape[1], dtype=np.int32).reshape(-1, 1)
        self.k, self.v, self.tables, self.device = k, v, tables, device
        self.n_slots, self.block = tables.shape[0], k.shape[2]
        self.n_blocks = k.shape[1]
        self.n_ctx = tables.shape[1] * self.block  # cells a slot can hold

    @classmethod
    def allocate(cls, config: ModelConfig, n_ctx: int, n_slots: int, n_layer: int,
                 device=None, n_blocks: int = 0) -> KVCache:
        """The CPU cache of n_layer layers (the first ones; the rest are `device`'s): blocks
        of `block_size(n_ctx)` cells. n_blocks 0: each slot holds the blocks of its n_ctx
        cells in order; else a pool of n_blocks blocks, the tables empty (-1)."""
        block = block_size(n_ctx)
        per = -(-n_ctx // block)
        pooled = n_blocks > 0
        n_blocks = n_blocks if pooled else n_slots * per
        stored = (n_layer, n_blocks, config.n_head_kv, block, config.head_dim)
        k = lazy_zeros(stored, np.uint16).transpose(0, 1, 3, 2, 4)  # (L, blocks, B, kv, hd)
        v = lazy_zeros(stored, np.uint16).transpose(0, 1, 3, 2, 4)
        if pooled:
            tables = np.full((n_slots, per), -1, np.int32)
        else:
            tables = np.arange(n_slots * per, dtype=np.int32).reshape(n_slots, per)
        return cls(k, v, tables, device)

    def _runs(self, slot: int, n_tokens: int):
        """(block, rows) covering slot's first n_tokens cells, in order."""
        for b in range(-(-n_tokens // self.block)):
            yield self.tables[slot, b], min(self.block, n_tokens - b * self.block)

    def copy_rows(self, src: int, dst: int, n_rows: int) -> None:
        """Rows [0, n_rows) of block src into block dst (copy-on-write of a shared block)."""
        self.k[:, dst, :n_rows] = self.k[:, src, :n_rows]
        self.v[:, dst, :n_rows] = self.v[:, src, :n_rows]
        if self.device is not None:
            self.device.copy_rows(src, dst, n_rows)

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        """Copy the first n_tokens cells of slot src into slot dst's own blocks."""
        if src != dst:
            for (a, rows), (b, _) in zip(self._runs(src, n_tokens), self._runs(dst, n_tokens)):
                if a != b:
                    self.copy_rows(a, b, rows)

    def block_bytes(self) -> int:
        """Bytes of one block, over every layer, K and V, host and device."""
        host = 2 * self.k[:, 0].nbytes
        return host + (self.device.block_bytes() if self.device is not None else 0)

    def slot_bytes(self, n_tokens: int) -> int:
        """Bytes of n_tokens cells of one slot, over every layer, K and V."""
        return self.block_bytes() * n_tokens // self.block

    def read(self, slot: int, n_tokens: int) -> tuple:
        """A host copy of slot's first n_tokens cells, (n_layer, n_tokens, n_kv, hd) K and
        V (for `write` to put back)."""
        runs = list(self._runs(slot, n_tokens)) or [(0, 0)]
        device = (self.device.read([b for b, _ in runs], n_tokens)
                  if self.device is not None else None)
        k = np.concatenate([self.k[:, b, :rows] for b, rows in runs], axis=1)
        v = np.concatenate([self.v[:, b, :rows] for b, rows in runs], axis=1)
        return k, v, device

    def write(self, slot: int, saved: tuple, n_tokens: int) -> None:
        """The first n_tokens cells of a `read` copy (taken from at least as many) into slot."""
        k, v, device = saved
        start = 0
        runs = list(self._runs(slot, n_tokens))
        for b, rows in runs:
            self.k[:, b, :rows] = k[:, start : start + rows]
            self.v[:, b, :rows] = v[:, start : start + rows]
            start += rows
        if self.device is not None:
            self.device.write([b for b, _ in runs], device, n_tokens)


def block_size(n_ctx: int) -> int:
    """Cells per KV block for a sequence limit of n_ctx: KV_BLOCK, or one block of n_ctx."""
    return KV_BLOCK if n_ctx > KV_BLOCK else n_ctx


def allocate_buffers(c: ModelConfig, n_batch: int, n_ctx: int, flash_attn: bool,
                     scratch: ActScratch, cache: KVCache) -> Buffers:
    """The layer loop's activation buffers for up to n_batch tokens, around the activation
    scratch and the KV cache: allocated once, at load."""
    import numba

    n_thr = numba.config.NUMBA_NUM_THREADS
    attn_scratch = (flash_scratch_floats(c.n_head, c.n_head_kv, c.head_dim) if flash_attn
                    else scratch_floats(c.n_head, c.n_head_kv, c.head_dim, n_ctx))

    def f32(*shape):  # resident only as far as a batch reaches (lazy_zeros)
        return lazy_zeros(shape, np.float32)

    return Buffers(
        x=f32(n_batch, c.n_embd), h=f32(n_batch, c.n_embd), o=f32(n_batch, c.n_embd),
        q=f32(n_batch, c.n_head, c.head_dim),
        k=f32(n_batch, c.n_head_kv, c.head_dim), v=f32(n_batch, c.n_head_kv, c.head_dim),
        attn=f32(n_batch, c.n_head, c.head_dim),
        gate=f32(n_batch, c.n_ff), up=f32(n_batch, c.n_ff), act=f32(n_batch, c.n_ff),
        xq=scratch.xq, xd=scratch.xd, xs=scratch.xs, xf=scratch.xf,
        scores=f32(n_thr, attn_scratch),
        attn_shared=f32(shared_floats(c.n_head, c.head_dim, n_ctx, n_thr)),
        k_cache=cache.k, v_cache=cache.v, kv_tables=cache.tables,
    )


class Transformer:
    def __init__(self, config: ModelConfig, weights: Weights, n_ctx: int, n_slots: int = 1,
                 n_batch: int = 512, flash_attn: bool = False, gpu_layers: int = 0,
                 kv_blocks: int = 0):
        """n_ctx: the cells one sequence may use. gpu_layers: how many of the last layers
        run on the CUDA device (cuda/offload.py), n_layer + 1 with the output head too
        (llama.cpp's -ngl). kv_blocks: 0, each slot its own n_ctx cells; else the KV cache is
        a pool of that many blocks that the caller hands out (KVCache.allocate)."""
        self.config, self.weights = config, weights
        self.n_ctx, self.n_batch = n_ctx, n_batch
        # flash: llama.cpp's -fa on numerics (online softmax); else its non-flash path, which
        # made the golden files (kernels/flash.py and kernels/attention.py say how they differ)
        self.flash_attn = flash_attn
        self.gpu_layers = max(0, min(gpu_layers, config.n_layer + 1))
        n_cpu = config.n_layer - min(self.gpu_layers, config.n_layer)  # layers 0 .. n_cpu-1
        self.numerics = numerics(config, weights, n_ctx)
        self.device = None
        if self.gpu_layers:
            from edgeinfer.cuda.offload import DeviceLayers

            self.device = DeviceLayers(config, weights, self.numerics,
                                       n_cpu, self.gpu_layers > config.n_layer, n_ctx,
                                       n_slots, n_batch, kv_blocks)
        self.kv_cache = KVCache.allocate(config, n_ctx, n_slots, n_cpu,
                                         self.device.cache if self.device else None, kv_blocks)
        linears = [weights.output] + [getattr(b, n) for b in weights.blocks for n in LINEARS]
        self.scratch = ActScratch(n_batch, max(lin.n_in for lin in linears))
        self.buffers = allocate_buffers(config, n_batch, self.kv_cache.n_ctx, flash_attn,
                                        self.scratch, self.kv_cache)
        # attention first, then the matrix products: on a cold cache the compile helper
        # (kernels/precompile.py) starts from the other end
        self.kernels = kernels(weights.blocks[:n_cpu], self.numerics, flash_attn)
        self.layers = layer_table(weights.blocks[:n_cpu], config.swa_layers[:n_cpu])
        # the head's padded rows (layers.product_rows); resident only once a batch uses them
        self.padded_logits = lazy_zeros((len(PAD_TO), config.n_vocab), np.float32)

    def forward(self, tokens: np.ndarray, positions: np.ndarray, slots: np.ndarray,
                logit_rows: np.ndarray, logits: np.ndarray) -> None:
        """Run tokens (n,) at positions (n,) in cache slots (n,), all int32, and write the
        logits of the rows `logit_rows` (m,) into logits (m, n_vocab). Batches larger
        than n_batch are split; rows must belong to the chunk order they appear in."""
        # the layer loop is compiled for contiguous int32 arrays
        tokens, positions, slots = (np.ascontiguousarray(a, dtype=np.int32)
                                    for a in (tokens, positions, slots))
        n = len(tokens)
        if n and (positions.max() >= self.n_ctx or positions.min() < 0):
            raise EdgeInferError(f"position out of range for context size {self.n_ctx}")
        done = 0
        for start in range(0, n, self.n_batch):
            stop = min(n, start + self.n_batch)
            sel = (logit_rows >= start) & (logit_rows < stop)
            rows = (logit_rows[sel] - start).astype(np.int32)
            m = len(rows)
            self._forward_chunk(tokens[start:stop], positions[start:stop], slots[start:stop],
                                rows, logits[done : done + m])
            done += m

    def _forward_chunk(self, tokens, positions, slots, rows, logits) -> None:
        c, w = self.config, self.weights
        n = len(tokens)
        x = self.buffers.x[:n]  # (n, n_embd)
        w.token_embd.lookup(tokens, x)
        if c.embd_scale != 1.0:
            ops.scale_inplace(x, c.embd_scale)
        run_layers(n, positions, slots, self.layers, self.buffers, self.numerics,
                   self.kernels)  # the CPU's layers, the first ones
        if self.device is not None:  # the rest, and the head when it is offloaded
            if self.device.forward(x, positions, slots, self.kv_cache.tables, rows, logits):
                self._finish_logits(logits)
                return
        if len(rows) == 0:
            return
        m = len(rows)
        picked = np.take(x, rows, axis=0, out=self.buffers.o[:m])  # (m, n_embd); o is free
        ops.rms_norm(picked, w.output_norm, c.norm_eps, self.buffers.h[:m])  # (m, n_embd)
        p = product_rows(m, min(len(self.buffers.h), len(self.padded_logits)))
        if p == m:
            project(self.buffers.h[:m], (w.output,), (logits,), self.scratch)  # (m, n_vocab)
        else:  # one tile of p rows (m..p stale), then the m rows copied out
            project(self.buffers.h[:p], (w.output,), (self.padded_logits[:p],), self.scratch)
            logits[:] = self.padded_logits[:m]
        self._finish_logits(logits)

    def _finish_logits(self, logits) -> None:
        w, c = self.weights, self.config
        if w.output_bias is not None:
            ops.add_bias(logits, w.output_bias)
        if c.final_softcap:
            ops.softcap(logits, c.final_softcap)
