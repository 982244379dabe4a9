"""The transformer forward pass, shared by every registered architecture.

`Transformer.forward` takes a batch of tokens, each with its own absolute position and KV
cache slot, so one call is a prompt prefill (one slot, consecutive positions), a batched
decode step (one token for each of several slots), or any mix: the server's continuous
batching stands on it. All buffers and the F16 KV cache are allocated once, at load.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field

import numpy as np

from edgeinfer.config import ModelConfig
from edgeinfer.errors import EdgeInferError
from edgeinfer.kernels import ops
from edgeinfer.kernels.attention import attention, scratch_floats, shared_floats, store_kv
from edgeinfer.kernels.flash import flash_attention, flash_scratch_floats
from edgeinfer.linear import ActScratch, project
from edgeinfer.weights import BlockWeights, Weights

GATED_ACTIVATIONS = {  # ModelConfig.ffn_act -> out = act(gate) * up
    "silu": ops.swiglu,
    "gelu_tanh": lambda gate, up, out: ops.geglu(gate, up, ops.GELU_TABLE, out),
}


class KVCache:
    """F16 keys and values (stored as uint16 bits) for every layer and slot."""

    def __init__(self, config: ModelConfig, n_ctx: int, n_slots: int):
        shape = (config.n_layer, n_slots, n_ctx, config.n_head_kv, config.head_dim)
        self.k = _lazy_zeros(shape, np.uint16)  # (n_layer, n_slots, n_ctx, n_kv, hd)
        self.v = _lazy_zeros(shape, np.uint16)
        self.n_ctx, self.n_slots = n_ctx, n_slots

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        """Reuse the first n_tokens cells of slot src in slot dst (prefix caching)."""
        if src != dst:
            self.k[:, dst, :n_tokens] = self.k[:, src, :n_tokens]
            self.v[:, dst, :n_tokens] = self.v[:, src, :n_tokens]


def _lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Private zeros whose memory becomes resident 4 KiB at a time, as tokens are written.
    numpy asks for 2 MiB transparent huge pages on large arrays, and a cache whose layers
    each take the first rows of their own huge page made a short run resident in all of
    them (+86 MB for SmolLM2 at 4096 tokens). Attention speed is the same on small pages."""
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


@dataclass(frozen=True)
class BatchViews:
    """The workspace cut to a batch of n tokens."""

    x: np.ndarray  # (n, n_embd) residual stream
    h: np.ndarray  # (n, n_embd) normed input of a sub-block
    o: np.ndarray  # (n, n_embd) sub-block output
    q: np.ndarray  # (n, n_head, hd)
    k: np.ndarray  # (n, n_kv, hd)
    v: np.ndarray  # (n, n_kv, hd)
    attn: np.ndarray  # (n, n_head, hd)
    q_rows: np.ndarray  # (n, n_head * hd): q as the q projection's output rows
    k_rows: np.ndarray  # (n, n_kv * hd)
    v_rows: np.ndarray  # (n, n_kv * hd)
    attn_rows: np.ndarray  # (n, n_head * hd): attn as attn_output's input rows
    gate: np.ndarray  # (n, n_ff)
    up: np.ndarray  # (n, n_ff)
    act: np.ndarray  # (n, n_ff) act(gate) * up


@dataclass
class Workspace:
    """Activation buffers for up to n_batch tokens, and their views per batch size (made
    once: a decode step would otherwise re-slice them a few hundred times)."""

    x: np.ndarray  # (n_batch, n_embd) residual stream
    h: np.ndarray  # (n_batch, n_embd) normed input of a sub-block
    o: np.ndarray  # (n_batch, n_embd) sub-block output
    q: np.ndarray  # (n_batch, n_head, hd)
    k: np.ndarray  # (n_batch, n_kv, hd)
    v: np.ndarray  # (n_batch, n_kv, hd)
    attn: np.ndarray  # (n_batch, n_head, hd)
    gate: np.ndarray  # (n_batch, n_ff)
    up: np.ndarray  # (n_batch, n_ff)
    act: np.ndarray  # (n_batch, n_ff) act(gate) * up: its own buffer, see _ffn_block
    scores: np.ndarray  # (n_threads, scratch) attention scratch (raw scores of a tile)
    attn_shared: np.ndarray  # (shared_floats,) attention's decode-split scratch
    scratch: ActScratch
    _views: dict[int, BatchViews] = field(default_factory=dict)

    def views(self, n: int) -> BatchViews:
        bv = self._views.get(n)
        if bv is None:
            q, k, v, attn = self.q[:n], self.k[:n], self.v[:n], self.attn[:n]
            bv = BatchViews(
                x=self.x[:n], h=self.h[:n], o=self.o[:n], q=q, k=k, v=v, attn=attn,
                q_rows=q.reshape(n, -1), k_rows=k.reshape(n, -1), v_rows=v.reshape(n, -1),
                attn_rows=attn.reshape(n, -1), gate=self.gate[:n], up=self.up[:n],
                act=self.act[:n])
            self._views[n] = bv
        return bv

    @classmethod
    def allocate(cls, c: ModelConfig, weights: Weights, n_batch: int, n_ctx: int,
                 flash_attn: bool = False):
        import numba

        f32 = np.float32
        linears = [weights.output] + [lin for b in weights.blocks for lin in _linears(b)]
        n_in_max = max(lin.n_in for lin in linears)
        attn_scratch = (flash_scratch_floats(c.n_head, c.n_head_kv, c.head_dim) if flash_attn
                        else scratch_floats(c.n_head, c.n_head_kv, c.head_dim, n_ctx))
        return cls(
            x=np.zeros((n_batch, c.n_embd), f32), h=np.zeros((n_batch, c.n_embd), f32),
            o=np.zeros((n_batch, c.n_embd), f32),
            q=np.zeros((n_batch, c.n_head, c.head_dim), f32),
            k=np.zeros((n_batch, c.n_head_kv, c.head_dim), f32),
            v=np.zeros((n_batch, c.n_head_kv, c.head_dim), f32),
            attn=np.zeros((n_batch, c.n_head, c.head_dim), f32),
            gate=np.zeros((n_batch, c.n_ff), f32), up=np.zeros((n_batch, c.n_ff), f32),
            act=np.zeros((n_batch, c.n_ff), f32),
            scores=np.zeros((numba.config.NUMBA_NUM_THREADS, attn_scratch), f32),
            attn_shared=np.zeros(shared_floats(c.n_head, c.head_dim, n_ctx,
                                               numba.config.NUMBA_NUM_THREADS), f32),
            scratch=ActScratch(n_batch, n_in_max),
        )


def _linears(b: BlockWeights):
    return (b.attn_q, b.attn_k, b.attn_v, b.attn_output, b.ffn_gate, b.ffn_up, b.ffn_down)


class Transformer:
    def __init__(self, config: ModelConfig, weights: Weights, n_ctx: int, n_slots: int = 1,
                 n_batch: int = 512, flash_attn: bool = False):
        self.config, self.weights = config, weights
        self.n_ctx, self.n_batch = n_ctx, n_batch
        # flash: llama.cpp's -fa on numerics (online softmax); else its non-flash path, which
        # made the golden files (kernels/flash.py and kernels/attention.py say how they differ)
        self.flash_attn = flash_attn
        self.attention = flash_attention if flash_attn else attention
        self.kv_cache = KVCache(config, n_ctx, n_slots)
        self.ws = Workspace.allocate(config, weights, n_batch, n_ctx, flash_attn)
        n_rot = config.n_rot
        self.rope_global = ops.rope_table(n_ctx, n_rot, config.rope_base,
                                          config.rope_freq_scale, weights.rope_freqs)
        self.rope_local = ops.rope_table(n_ctx, n_rot, config.rope_base_swa, 1.0)
        cache = self.kv_cache
        self.kv_layers = [(cache.k[il], cache.v[il]) for il in range(config.n_layer)]
        self.score_scale = np.float32(1.0 if config.q_prescale else config.attn_scale)

    def forward(self, tokens: np.ndarray, positions: np.ndarray, slots: np.ndarray,
                logit_rows: np.ndarray, logits: np.ndarray) -> None:
        """Run tokens (n,) at positions (n,) in cache slots (n,), all int32, and write the
        logits of the rows `logit_rows` (m,) into logits (m, n_vocab). Batches larger
        than n_batch are split; rows must belong to the chunk order they appear in."""
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
        c, w, ws = self.config, self.weights, self.ws
        bv = ws.views(len(tokens))
        w.token_embd.lookup(tokens, bv.x)  # (n, n_embd)
        if c.embd_scale != 1.0:
            ops.scale_inplace(bv.x, c.embd_scale)
        for il, block in enumerate(w.blocks):
            self._attention_block(il, block, bv, positions, slots)
            self._ffn_block(block, bv)
        if len(rows) == 0:
            return
        h = ws.h[: len(rows)]  # (m, n_embd)
        ops.rms_norm(np.ascontiguousarray(bv.x[rows]), w.output_norm, c.norm_eps, h)
        project(h, (w.output,), (logits,), ws.scratch)  # (m, n_vocab)
        if w.output_bias is not None:
            ops.add_bias(logits, w.output_bias)
        if c.final_softcap:
            ops.softcap(logits, c.final_softcap)

    def _attention_block(self, il, b: BlockWeights, bv: BatchViews, positions, slots) -> None:
        c, ws = self.config, self.ws
        ops.rms_norm(bv.x, b.attn_norm, c.norm_eps, bv.h)  # (n, n_embd)
        project(bv.h, (b.attn_q, b.attn_k, b.attn_v), (bv.q_rows, bv.k_rows, bv.v_rows),
                ws.scratch)  # (n, n_head, hd), (n, n_kv, hd) x2
        for t, bias in ((bv.q_rows, b.attn_q_bias), (bv.k_rows, b.attn_k_bias),
                        (bv.v_rows, b.attn_v_bias)):
            if bias is not None:
                ops.add_bias(t, bias)
        if b.attn_q_norm is not None:
            ops.rms_norm_heads(bv.q, b.attn_q_norm, c.norm_eps)
            ops.rms_norm_heads(bv.k, b.attn_k_norm, c.norm_eps)
        swa = c.swa_layers[il]
        cos, sin = self.rope_local if swa else self.rope_global
        ops.rope(bv.q, positions, cos, sin, c.rope_neox)
        ops.rope(bv.k, positions, cos, sin, c.rope_neox)
        if c.q_prescale:
            ops.scale_inplace(bv.q, c.attn_scale)
        kc, vc = self.kv_layers[il]  # (n_slots, n_ctx, n_kv, hd) x2
        store_kv(bv.k, bv.v, slots, positions, kc, vc)
        window = c.sliding_window if swa else 0
        self.attention(bv.q, kc, vc, slots, positions, window, self.score_scale, ws.scores,
                       ws.attn_shared, bv.attn)  # (n, n_head, hd)
        project(bv.attn_rows, (b.attn_output,), (bv.o,), ws.scratch)  # (n, n_embd)
        if b.attn_output_bias is not None:
            ops.add_bias(bv.o, b.attn_output_bias)
        self._add_residual(bv, b.post_attention_norm)

    def _ffn_block(self, b: BlockWeights, bv: BatchViews) -> None:
        c, ws = self.config, self.ws
        ops.rms_norm(bv.x, b.ffn_norm, c.norm_eps, bv.h)  # (n, n_embd)
        project(bv.h, (b.ffn_gate, b.ffn_up), (bv.gate, bv.up), ws.scratch)  # (n, n_ff) x2
        # Element-wise kernels write buffers distinct from their inputs: with an aliased
        # output, LLVM's overlap check fails at run time and the loop runs scalar (SwiGLU of
        # 8 rows: 64 us instead of 10).
        GATED_ACTIVATIONS[c.ffn_act](bv.gate, bv.up, bv.act)  # (n, n_ff) act(gate) * up
        project(bv.act, (b.ffn_down,), (bv.o,), ws.scratch)  # (n, n_embd)
        self._add_residual(bv, b.post_ffw_norm)

    def _add_residual(self, bv: BatchViews, post_norm: np.ndarray | None) -> None:
        """x += o, through the sub-block's post-norm (gemma3) when it has one, written into h
        (free by now): an output apart from its input, as above."""
        out = bv.o  # (n, n_embd)
        if post_norm is not None:
            ops.rms_norm(bv.o, post_norm, self.config.norm_eps, bv.h)
            out = bv.h
        ops.add_inplace(bv.x, out)
