"""Matrix-product kernels for the legacy GGML quant types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1.

Each kernel has the registry's uniform signature `kernel(w, xq, xd, xs, xf, out)` and writes
out[t, r] = dot(w[r], x[t]) for every token t and output row r.

Integer types follow llama.cpp's `ggml_vec_dot_*_q8_*` (ggml-cpu/arch/x86/quants.c): per
32-value block an exact integer dot product into 8 int32 lanes, converted to f32 and
accumulated with one FMA by d_w*d_x into an f32 vector accumulator that lives across blocks;
the `_1` types add sum(m_w * s_x) separately. The block loop is hand-written LLVM vector IR
(`numba.extending.intrinsic`): LLVM's auto-vectorizers were fragile on nibble formats
(docs/performance.md, Kernels). The integer dot and the multi-block steps are the chosen ISA
module's (isa/: vnni, avx2 or generic, by target.DOT_PATH); this file holds what they share:
the tile, its block loop and the one- or two-block step, and the kernels. The integer sums are
exact on every path. The weight blocks are decoded by legacy_blocks.py.

The float types (F32, F16, BF16) are in floats.py.

Tiling: one intrinsic call computes a register tile of 1 or 2 rows (_tile_rows) x 8 tokens
(prefill, batches of 8+; smaller batches 4, 2 or 1): each weight block is decoded once per 8
tokens, each activation block loaded once per tile's rows, and the accumulators stay in
registers (or, on AVX2's 2-row tiles, in L1) for the whole row; at the end all of a tile's
accumulators are summed across their lanes together (ir.hsums). Parallelism: chunks of about
ROWS_PER_CHUNK rows, whose weights stay in L1 while the tokens stream past (products of up to
8 tokens: DECODE_ROWS_PER_CHUNK, fewer chunk starts where nothing stays); each thread runs
a contiguous share of them, then helps with the others' (schedule.py); products under
SERIAL_WORK run on the calling thread.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba import literally, njit, prange, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from edgeinfer.kernels.actquant import Q8_0_ACT, Q8_0_GROUPED_ACT, Q8_1_ACT
from edgeinfer.kernels.f16 import half_to_f32
from edgeinfer.kernels.ir import (
    Array2D,
    fma,
    hsums,
    lanes_of,
    load,
    load_f16,
    loop_or_once,
    prefetch,
    repeat_lanes,
    shuffle,
    splat,
    splat_value,
    vec,
)
from edgeinfer.kernels.isa import ISA
from edgeinfer.kernels.legacy_blocks import BLOCK_FORMATS, BlockFormat, block_dwords
from edgeinfer.kernels.registry import register
from edgeinfer.kernels.schedule import chunk_counters, n_workers, next_chunk

_I1, _I8, _I16, _I32, _I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
_F32 = ir.FloatType()


# ---- the tile: a register block of rows x tokens


LOGITS = 1 << 8  # a kernel code: its GGML type, plus LOGITS for the output head's variant


def _block_format(code: int) -> BlockFormat:
    """The BLOCK_FORMATS entry of a kernel code, without the AVX2 8-block decoders where the
    kernel keeps llama.cpp's block order."""
    fmt = BLOCK_FORMATS[code & (LOGITS - 1)]
    wide = fmt.has_min or code & LOGITS
    return fmt if wide else fmt._replace(ymm=None, pair=None)


class _Tile:
    """Emits out[t0 + t, r0 + r] = dot(weight row r0 + r, token t0 + t) for an R x T tile.

    Per step of the block loop, each of the R weight blocks is decoded once for the T tokens
    and each token's activations are loaded once for the R rows; the R*T vector accumulators
    stay in registers for the whole row. The row's start goes through the ISA's multi-block
    steps (ISA.wide_steps, which call back blocks, scale_add, fma_into and lane_mins), the
    rest through `step`, ISA.BLOCKS_PER_STEP blocks at a time, then an odd last block."""

    def __init__(self, fmt: BlockFormat, rows: int, toks: int):
        self.fmt, self.rows, self.toks = fmt, rows, toks
        self.block_bytes, self.bias, self.max_u = fmt.block_bytes, fmt.bias, fmt.max_u
        self.has_min = fmt.has_min

    def blocks(self, builder, w_row, i, n: int):
        """Pointers to blocks i .. i+n-1 of a weight row."""
        size = _I64(self.block_bytes)
        return [builder.gep(w_row, [builder.mul(builder.add(i, _I64(k)), size)]) for k in range(n)]

    @staticmethod
    def scale_add(builder, acc, isum, d_w, d_x):
        """acc += float(isum) * d_w * d_x: the block sums, scaled, into an accumulator."""
        value = builder.sitofp(isum, d_w.type)
        _Tile.fma_into(builder, acc, value, builder.fmul(d_w, d_x))

    @staticmethod
    def fma_into(builder, acc, a, b):
        """acc += a * b, lane by lane. A narrower product (the odd block's 8 lanes, added
        last) goes into its first lanes by a rounded product and an add, as into a zeroed
        accumulator of its own and then the sum, without 16 more accumulators to zero and
        add up in every tile."""
        total, n = builder.load(acc), a.type.count
        if total.type.count == n:
            total = fma(builder, a, b, total)
        else:
            part = builder.fmul(a, b)
            zeros = ir.Constant(part.type, [0.0] * n)
            total = builder.fadd(total, shuffle(builder, part, zeros, list(range(2 * n))))
        builder.store(total, acc)

    def _weights(self, builder, w_row, ahead, i, nb: int):
        """Step's blocks of one row: (u or signed <32nb x i8>, d <8nb x f32>)."""
        blks = self.blocks(builder, w_row, i, nb)
        prefetch(builder, builder.gep(blks[0], [ahead]))
        q = self.fmt.single(builder, blks[0])
        if nb == 2:
            q = shuffle(builder, q, self.fmt.single(builder, blks[1]), list(range(64)))
        if not ISA.BIASED_WEIGHTS and self.bias:  # the ISA's dot wants signed values
            q = builder.sub(q, splat(_I8, 32 * nb, self.bias))
        d = repeat_lanes(builder, [load_f16(builder, b, 0) for b in blks], 8)
        return q, ISA.step_scales(builder, d, self.toks)

    def step(self, builder, w_rows, ahead, toks, i, nb: int, accs):
        """Adds blocks i .. i+nb-1 of every (row, token) pair into its accumulators; where
        the ISA's steps add the `_1` formats' minimums term, this one too (lane_mins)."""
        lanes = [k for k in range(nb) for _ in range(8)]  # block of each lane
        weights = [self._weights(builder, w_row, ahead, i, nb) for w_row in w_rows]
        mins = ([self.lane_mins(builder, w_row, i, nb, 8) for w_row in w_rows]
                if self.has_min and ISA.STEPS_ADD_MINS else [])
        for t, (xq, xd, xs) in enumerate(toks):
            x = load(builder, xq, builder.mul(i, _I64(32)), vec(_I8, 32 * nb))
            d_x = load(builder, xd, builder.mul(i, _I64(4)), vec(_F32, nb))
            d_x = shuffle(builder, d_x, d_x, lanes)
            corr = ISA.bias_correction(builder, x, self.bias, 8 * nb)
            if mins:  # the blocks' sums d_x * sum(x), Q8_1's s
                s_x = load(builder, xs, builder.mul(i, _I64(4)), vec(_F32, nb))
                s_x = shuffle(builder, s_x, s_x, lanes)
            for r, (q, d_w) in enumerate(weights):
                isum = ISA.block_dot(builder, q, x, corr, unsigned=not self.bias)
                self.scale_add(builder, accs[r][t], isum, d_w, d_x)
                if mins:
                    self.fma_into(builder, accs[r][t], mins[r], s_x)

    def lane_mins(self, builder, w_row, i, nb: int, per_block: int):
        """m (the f16 at byte 2) of blocks i .. i+nb-1 as <per_block*nb x f32>: block k's in
        lane per_block*k, zero in the others, so that the accumulators' lanes, summed at the
        end, hold each block's m_w * s_x once."""
        vf = vec(_F32, per_block * nb)
        m = ir.Constant(vf, [0.0] * per_block * nb)
        for k, blk in enumerate(self.blocks(builder, w_row, i, nb)):
            m = builder.insert_element(m, load_f16(builder, blk, 2), _I32(per_block * k))
        return m

    def _add_mins(self, builder, w_rows, toks, start, n_blocks, accs):
        """The `_1` formats' sum over blocks of m_w * s_x (llama.cpp's `summs`) where the steps
        do not add it (AVX2 after its 8- and 2-block steps, NEON): into the tile's accumulators
        (their lanes are summed at the end) 8 blocks at a time from block `start`, each row's
        minimums gathered, each token's sums loaded, masked past the last block: in the steps
        it was a mostly-zero vector FMA and its operands in every step. With AVX-512 the steps
        add their own (ISA.STEPS_ADD_MINS), where this pass over a row's last few blocks cost
        more. Kept in separate sums instead, as llama.cpp adds summs after the rest,
        SmolLM2's golden logits moved further from llama.cpp's."""
        lanes = 8
        n_left = builder.sub(n_blocks, start)
        lane = ir.Constant(vec(_I64, lanes), list(range(lanes)))
        n_groups = builder.udiv(builder.add(n_left, _I64(lanes - 1)), _I64(lanes))
        with cgutils.for_range(builder, n_groups) as loop:
            first = builder.add(start, builder.mul(loop.index, _I64(lanes)))
            mask = builder.icmp_signed("<", lane, splat_value(  # blocks before the row's end
                builder, builder.sub(n_blocks, first), lanes))
            mins = [self._gathered_mins(builder, w_row, first, mask) for w_row in w_rows]
            self._fma_mins(builder, toks, first, mask, mins, accs)

    @staticmethod
    def _fma_mins(builder, toks, first, mask, mins, accs):
        """accs[r][t] += m_w of row r * s_x of token t, lane by lane, for the blocks from
        `first` (the tokens' sums loaded masked: 0 past the row's end)."""
        lanes = mask.type.count
        vf = vec(_F32, lanes)
        masked_load = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(vf, [vf.as_pointer(), _I32, vec(_I1, lanes), vf]),
            f"llvm.masked.load.v{lanes}f32.p0",
        )
        for t, (_, _, xs) in enumerate(toks):
            ptr = builder.bitcast(builder.gep(xs, [builder.mul(first, _I64(4))]),
                                  vf.as_pointer())
            s_x = builder.call(masked_load, [ptr, _I32(4), mask, ir.Constant(vf, [0.0] * lanes)])
            for r, m_w in enumerate(mins):
                _Tile.fma_into(builder, accs[r][t], m_w, s_x)

    def _gathered_mins(self, builder, w_row, first, mask):
        """Blocks first .. first + lanes - 1 by one gather, 0 where `mask` is off."""
        size = self.block_bytes
        blk0 = builder.gep(w_row, [builder.mul(first, _I64(size))])
        got = block_dwords(builder, blk0, size, 2, mask.type.count, mask)
        return half_to_f32(builder, builder.trunc(got, vec(_I16, mask.type.count)))

    def emit(self, context, builder, sig, args):
        w, xq, xd, xs, out = (
            Array2D(context, builder, sig.args[k], args[k]) for k in (3, 5, 6, 7, 9)
        )
        r0, t0 = args[4], args[8]
        w_rows = [w.row(builder.add(r0, _I64(r))) for r in range(self.rows)]
        # the same block, PREFETCH_TILES tiles of rows further on
        ahead = builder.mul(w.stride, _I64(PREFETCH_TILES * self.rows))
        toks = []
        for t in range(self.toks):
            tok = builder.add(t0, _I64(t))
            toks.append([xq.row(tok), xd.row(tok), xs.row(tok)])
        self.firsts = (toks[0], [xq.stride, xd.stride, xs.stride])
        # the weight row fixes n_in: activation buffers may be wider (shared scratch space)
        n_blocks = builder.udiv(w.n_cols, _I64(self.block_bytes))
        lanes = 8 * ISA.BLOCKS_PER_STEP
        zero = ir.Constant(vec(_F32, lanes), [0.0] * lanes)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in toks] for _ in w_rows]
        step = _I64(ISA.BLOCKS_PER_STEP)
        done, mins_done = ISA.wide_steps(self, builder, w_rows, ahead, toks, n_blocks, accs)
        left = builder.sub(n_blocks, done)
        with loop_or_once(builder, builder.udiv(left, step), ISA.ONE_TAIL_STEP) as k:
            i = builder.add(done, builder.mul(k, step))
            self.step(builder, w_rows, ahead, toks, i, ISA.BLOCKS_PER_STEP, accs)
        if self.has_min and not ISA.STEPS_ADD_MINS:
            self._add_mins(builder, w_rows, toks, mins_done, n_blocks, accs)
        if ISA.BLOCKS_PER_STEP == 2:  # an odd block count leaves one block, added last
            with builder.if_then(
                builder.icmp_unsigned("!=", builder.urem(n_blocks, step), _I64(0))
            ):
                self.step(builder, w_rows, ahead, toks, builder.sub(n_blocks, _I64(1)), 1, accs)
        # token by token, each token's rows side by side: one store of its `rows` adjacent
        # outputs out[t, r0:r0 + rows], not a scalar store and lane extract per output;
        # every sum keeps its order (hsums)
        sums = hsums(builder, [builder.load(accs[r][t]) for t in range(self.toks)
                               for r in range(self.rows)])
        for t in range(self.toks):
            row = lanes_of(builder, sums, t * self.rows, self.rows)
            ptr = builder.gep(out.row(builder.add(t0, _I64(t))), [builder.mul(r0, _I64(4))])
            builder.store(row, builder.bitcast(ptr, row.type.as_pointer()), align=4)
        return context.get_dummy_value()


def _is_2d(ty, dtype) -> bool:
    return isinstance(ty, types.Array) and ty.ndim == 2 and ty.layout == "C" and ty.dtype == dtype


def _literal_int(ty) -> int:
    if not isinstance(ty, types.IntegerLiteral):
        raise TypingError("_tile needs compile-time constant format, rows and tokens")
    return ty.literal_value


# Prefetch distance: the same block in the rows PREFETCH_TILES tiles on, so every row a tile
# will read is in flight that many tiles earlier, whatever the row width (counted in rows,
# narrow rows were prefetched too late for DRAM: docs/performance.md, Kernels).
PREFETCH_TILES = 4


@intrinsic
def _tile(typingctx, code, rows, toks, w, r0, xq, xd, xs, t0, out):
    """(code, rows, toks, w, r0, xq, xd, xs, t0, out): writes out[t0:t0+toks, r0:r0+rows].
    code (a GGML type, plus LOGITS for a head kernel), rows and toks must be compile-time
    constants."""
    fmt, n_rows, n_toks = _block_format(_literal_int(code)), _literal_int(rows), _literal_int(toks)
    ok = (
        _is_2d(w, types.uint8)
        and _is_2d(xq, types.int8)
        and _is_2d(xd, types.float32)
        and _is_2d(xs, types.float32)
        and _is_2d(out, types.float32)
    )
    if not ok:
        raise TypingError("legacy kernels need C-contiguous 2-D arrays of the documented dtypes")
    emitter = _Tile(fmt, n_rows, n_toks)
    sig = types.none(code, rows, toks, w, types.intp, xq, xd, xs, types.intp, out)
    return sig, emitter.emit


# ---- kernels: one per type, made by one factory

def _tile_rows(code: int) -> int:
    """Register tile rows (x up to 8 tokens) of a kernel code: the ISA's choice for its
    registers (ISA.tile_rows)."""
    return ISA.tile_rows(_block_format(code))


ROWS_PER_CHUNK = 16  # output rows per chunk, rounded up to whole tiles: stays in L1
# Products of up to 8 tokens (decode, batched decode) reuse a chunk's weights for at most one
# token tile, so they keep nothing in L1 and take chunks twice as long: fewer chunk starts and
# counter updates (docs/performance.md, Kernels).
DECODE_ROWS_PER_CHUNK = 32
# Below this many weight bytes x tokens a matmul runs on one thread: fork/join of the second
# costs more than it saves on a small matrix.
SERIAL_WORK = 64 * 1024


@njit(cache=True, nogil=True)
def _chunk_tokens(code, n_rows, n_toks, w, xq, xd, xs, out, r0, r1) -> None:
    """Rows [r0, r1) x all tokens in tiles of n_rows x n_toks; a last partial tile is moved
    back to overlap the previous one (recomputing a few identical outputs)."""
    literally(code)
    literally(n_rows)
    literally(n_toks)
    n_tok = out.shape[0]
    for t in range(0, n_tok, n_toks):
        t = min(t, n_tok - n_toks)
        for r in range(r0, r1, n_rows):
            _tile(code, n_rows, n_toks, w, min(r, r1 - n_rows), xq, xd, xs, t, out)


@njit(cache=True, nogil=True)
def _chunk_rows(rows, n_tok):
    per_chunk = DECODE_ROWS_PER_CHUNK if n_tok <= 8 else ROWS_PER_CHUNK
    return (per_chunk + rows - 1) // rows * rows


@njit(cache=True, nogil=True)
def _chunk(code, rows, w, xq, xd, xs, out, c) -> None:
    """Output rows of chunk c for every token, in tiles of `rows` rows x 8 tokens (prefill,
    batches of 8+), else 4, 2 or 1, so a weight block is decoded once for as many tokens as
    possible."""
    literally(code)
    literally(rows)
    n_tok, n_out = out.shape
    chunk_rows = _chunk_rows(rows, n_tok)
    r0 = c * chunk_rows
    r1 = n_out if r0 + 2 * chunk_rows > n_out else r0 + chunk_rows
    if r1 - r0 < rows:  # fewer rows than a tile
        _chunk_tokens(code, 1, 1, w, xq, xd, xs, out, r0, r1)
    elif n_tok >= 8:
        _chunk_tokens(code, rows, 8, w, xq, xd, xs, out, r0, r1)
    elif n_tok >= 4:
        _chunk_tokens(code, rows, 4, w, xq, xd, xs, out, r0, r1)
    elif n_tok >= 2:
        _chunk_tokens(code, rows, 2, w, xq, xd, xs, out, r0, r1)
    else:
        _chunk_tokens(code, rows, 1, w, xq, xd, xs, out, r0, r1)


def _make_matmul(qtype: T, logits: bool = False):
    """The kernel for one type (logits: its output-head variant). Its closure holds only the
    ints `code` and `rows` (numba's on-disk cache pickles closure cells; a pickled dispatcher
    or intrinsic differs between processes)."""
    code = int(qtype) | (LOGITS if logits else 0)
    rows = _tile_rows(code)

    def matmul(w, xq, xd, xs, xf, out) -> None:  # xf unused: uniform kernel signature
        n_tok, n_out = out.shape
        n_chunks = max(n_out // _chunk_rows(rows, n_tok), 1)
        if w.shape[1] * n_out * n_tok < SERIAL_WORK:  # no fork/join for a small product
            for c in range(n_chunks):
                _chunk(code, rows, w, xq, xd, xs, out, np.int64(c))
        else:  # each thread its own rows, then helps the others (schedule.py)
            counters, n_seg = chunk_counters(), n_workers(n_chunks)
            for task in prange(n_seg):
                c, k = next_chunk(counters, np.int64(task), np.int64(0), n_chunks, n_seg)
                while c >= 0:
                    _chunk(code, rows, w, xq, xd, xs, out, c)
                    c, k = next_chunk(counters, np.int64(task), k, n_chunks, n_seg)

    name = f"matmul_{qtype.name.lower()}" + ("_logits" if logits else "")
    matmul.__name__ = matmul.__qualname__ = name
    return njit(parallel=True, cache=True, nogil=True)(matmul)


matmul_q8_0 = _make_matmul(T.Q8_0)
matmul_q4_0 = _make_matmul(T.Q4_0)
matmul_q4_1 = _make_matmul(T.Q4_1)
matmul_q5_0 = _make_matmul(T.Q5_0)
matmul_q5_1 = _make_matmul(T.Q5_1)
# the output head's kernels, where they differ (AVX2): the 8-block step on grouped activations
LOGITS_KERNELS = {
    qtype: (Q8_0_GROUPED_ACT, _make_matmul(qtype, logits=True))
    for qtype in (T.Q8_0, T.Q4_0, T.Q5_0) if ISA.HEAD_KERNELS
}


register(T.Q8_0, Q8_0_ACT, matmul_q8_0, LOGITS_KERNELS.get(T.Q8_0))
register(T.Q4_0, Q8_0_ACT, matmul_q4_0, LOGITS_KERNELS.get(T.Q4_0))
register(T.Q4_1, Q8_1_ACT, matmul_q4_1)
register(T.Q5_0, Q8_0_ACT, matmul_q5_0, LOGITS_KERNELS.get(T.Q5_0))
register(T.Q5_1, Q8_1_ACT, matmul_q5_1)
