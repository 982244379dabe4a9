"""Causal grouped-query attention over the F16 KV cache, tiled for prefill and long contexts.

One kernel serves prefill (many tokens of one sequence) and batched decode (one token of each
of several sequences): every query row carries its own sequence slot and absolute position,
and attends to cells [lo, pos] of that sequence, where lo = pos - window + 1 on
sliding-window layers (llama.cpp's causal mask with `n_swa`).

The cache is paged: a layer's K (and V) is a pool of blocks (n_blocks, B, n_kv, hd), and
cell p of slot s is row p % B of block tables[s, p // B]. B is a multiple of KEY_BLOCK (or
the table has one column: a contiguous cache of B = n_ctx cells per slot), so a key block
never straddles two cache blocks and the sums are the same bits whatever the table says.

Work is split into items: a tile of consecutive same-slot tokens x one KV head. The tile's
rows are its tokens x the query heads of that KV group, so each K and V row is converted from
F16 once and used by all of them, in 4-row x 4-key register blocks. Keys are visited in
blocks of KEY_BLOCK cells aligned to absolute positions, so a row computes the same sums
whether it is decoded alone or prefilled in a tile (cached decode == full forward, bit for
bit). A lone decode token has too few items for the threads, so its keys are split in ranges.

Numerics are llama.cpp's non-flash path (build_attn_mha), which produced the golden files,
and are kept exactly rather than through an online softmax: an online softmax must round P
to F16 before the row's final max and sum are known, and those one-ulp differences in P
measurably moved the logits away from llama.cpp's (golden median |diff| on the prompts of
SmolLM2 0.06 -> 0.14). So each tile keeps its rows' raw scores (a per-thread buffer of at
most SCORE_BUDGET floats; long contexts get fewer tokens per tile) and does, per row:
Q rounded to F16, f32 dot products with the F16 keys, x*scale, max, exp(x - max) by ggml's
own vectorized expf (bit for bit its AVX-512 build's), sum in double, P = x * (float)(1/sum)
rounded to F16, then f32 P·V with the F16 values. Only the f32 summation orders differ from
ggml's.
"""

from __future__ import annotations

import numpy as np
from numba import get_thread_id, njit, prange, types
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic, overload
from numba.np.ufunc.parallel import _iget_num_threads

from edgeinfer.kernels import native
from edgeinfer.kernels.attn_blocks import fits, score_block, value_block
from edgeinfer.kernels.expf import expf
from edgeinfer.kernels.f16 import f16_bits_to_f32, f32_to_f16_bits, round_f16
from edgeinfer.kernels.native import call
from edgeinfer.kernels.prefetch import prefetch
from edgeinfer.kernels.schedule import chunk_counters, n_workers, next_chunk

# Reassociation lets LLVM vectorize the q.k reductions (strict f32 order keeps them scalar);
# llama.cpp's SIMD dot products reorder their sums the same way.
FAST = {"reassoc", "contract"}

TILE_TOKENS = 16  # most query tokens per tile: 16 x (heads per KV head) rows share each K/V row
KEY_BLOCK = 64  # keys converted and multiplied per step; a multiple of the 4-key unroll
SCORE_BUDGET = 1 << 18  # floats of raw scores a tile may keep (1 MiB: fits in L2)
# P.V sums are kept per segment of this many keys, aligned to absolute positions, and added
# in order, so a row's output is the same bits whether its keys are split across threads
# (a lone long decode row) or not (in a batch, a prefill tile, on one thread).
SEGMENT_KEYS = 512  # a multiple of KEY_BLOCK
SPLIT_MIN_KEYS = SEGMENT_KEYS  # a decode row's keys are split in ranges at least this long
SERIAL_MACS = 1 << 18  # calls with less work (q.k + p.v multiply-adds) run on one thread
# A layer's KV rows are cold at each step (the weights streamed through the caches since), and
# one KV head's rows are strided, which the hardware prefetcher follows poorly. The K pass asks
# for K and V rows this far ahead, so the V pass finds them in cache (prefetching again in the
# V pass cost more; docs/performance.md, Kernels).
PREFETCH_KEYS = 8


def scratch_floats(n_head: int, n_head_kv: int, head_dim: int, n_ctx: int) -> int:
    """float32s of per-thread scratch `attention` needs in each row of `scores` for this model
    and context size; a smaller `scores` still works, but then each call allocates it."""
    group = n_head // n_head_kv
    return int(_scratch_floats(_tile_tokens(group, n_ctx) * group, head_dim, n_ctx))


def shared_floats(n_head: int, head_dim: int, n_ctx: int, n_threads: int) -> int:
    """float32s of `shared` that the decode split of attention or flash_attention needs (the
    scores of the rows it splits, or their (M, S); their partial value sums): fewer than
    2 * n_threads rows, in at most 2 * n_threads key ranges. A smaller `shared` still works,
    but then each such call allocates it."""
    rows = 2 * n_threads
    parts = max(2 * n_threads, _max_segments(n_ctx))  # flash's key ranges, attention's segments
    return rows * n_head * (n_ctx + parts * (head_dim + 2))


@njit(cache=True, nogil=True)
def _max_segments(n_keys):
    """The most segments a range of n_keys keys can touch."""
    return n_keys // SEGMENT_KEYS + 2


@njit(cache=True, nogil=True)
def _segments(ka, kb):
    """The segments [first, end) that cover keys [ka, kb)."""
    return ka // SEGMENT_KEYS, (kb - 1) // SEGMENT_KEYS + 1


@njit(cache=True, nogil=True)
def _segment_blocks(seg, ka, kb):
    """The key blocks [lo, hi) of segment seg that hold keys of [ka, kb)."""
    per = SEGMENT_KEYS // KEY_BLOCK
    return max(seg * per, ka // KEY_BLOCK), min((seg + 1) * per, (kb - 1) // KEY_BLOCK + 1)


@njit(cache=True, nogil=True)
def _tile_tokens(group, n_ctx):
    return max(1, min(TILE_TOKENS, SCORE_BUDGET // (group * n_ctx)))


@njit(cache=True, nogil=True)
def _scratch_floats(rows, hd, n_ctx):
    return rows * hd + (rows + 3) * hd + KEY_BLOCK * hd + rows * n_ctx


@njit(cache=True, nogil=True)
def _tile_views(buf, rows, hd):
    """The start of a thread's scratch row, as both kernels lay it out: the tile's Q rows,
    its accumulators (+3 spare rows), a block of K or V rows converted to f32; and the
    offset where the rest begins."""
    qt = buf[: rows * hd].reshape((rows, hd))
    off = rows * hd
    acc = buf[off : off + (rows + 3) * hd].reshape((rows + 3, hd))
    off += (rows + 3) * hd
    kf = buf[off : off + KEY_BLOCK * hd].reshape((1, KEY_BLOCK, 1, hd))  # as a cache slice
    return qt, acc, kf, off + KEY_BLOCK * hd


@njit(cache=True, nogil=True)
def _thread_scratch(buf, rows, hd, n_ctx):
    """One thread's views of its scratch row: _tile_views, then the rows' scores, then
    probabilities."""
    qt, acc, kf, off = _tile_views(buf, rows, hd)
    sc = buf[off : off + rows * n_ctx].reshape((rows, n_ctx))
    return qt, acc, kf, sc


@njit(cache=True, nogil=True)
def _work_item(w, n_items, n_kv):
    """Work item w's (chunk, KV head). Zigzag order: causal prefill chunks grow in cost, and
    each thread starts on a contiguous range of w (schedule.py), so pair cheap early items
    with expensive late ones."""
    item = w // 2 if w % 2 == 0 else n_items - 1 - w // 2
    return item // n_kv, item % n_kv


@njit(cache=True, nogil=True, fastmath=FAST)
def _scaled_max(x, scale):
    """x *= scale (x a view, so loops run from 0 and vectorize); returns max(x)."""
    n = x.shape[0]
    for k in range(n):
        x[k] *= scale
    t0 = t1 = t2 = t3 = np.float32(-np.inf)  # 4 partial maxima: one chain is latency-bound
    for k in range(n // 4):
        t0 = max(t0, x[4 * k])
        t1 = max(t1, x[4 * k + 1])
        t2 = max(t2, x[4 * k + 2])
        t3 = max(t3, x[4 * k + 3])
    for k in range(n - n % 4, n):
        t0 = max(t0, x[k])
    return max(max(t0, t1), max(t2, t3))


@njit(cache=True, nogil=True, fastmath=FAST)
def _softmax_row(x, scale):
    """llama.cpp's soft_max_f32 on one row of raw dots x (a view, so loops run from 0 and
    vectorize): x*scale, max, exp(x - max), sum in double, then P = x * (float)(1/sum)
    rounded to F16, which its F16 P·V matmul does when it converts P."""
    n = x.shape[0]
    top = _scaled_max(x, scale)
    for k in range(n):  # apart from the double sum, which would keep this loop scalar
        x[k] = expf(x[k] - top)
    t0 = t1 = t2 = t3 = 0.0
    for k in range(n // 4):
        t0 += x[4 * k]
        t1 += x[4 * k + 1]
        t2 += x[4 * k + 2]
        t3 += x[4 * k + 3]
    for k in range(n - n % 4, n):
        t0 += x[k]
    total = (t0 + t1) + (t2 + t3)
    inv = np.float32(1.0 / total)
    for k in range(n):
        x[k] = round_f16(x[k] * inv)


# ------------------------------------------------------------------ 4 x 4 register blocks


def _f32(x):
    """x as float32: F16 bits are converted, float32 passes through."""


@overload(_f32, inline="always")
def _f32_impl(x):
    if x == types.uint16:
        return lambda x: f16_bits_to_f32(x)
    if x == types.float32:
        return lambda x: x
    return None


@njit(cache=True, nogil=True)
def _prefetch_kv(k_cache, v_cache, s, j, kvh, end):
    """Prefetch cache row j < end of KV head kvh in slot s, keys and values (64-byte lines)."""
    if j < end:
        for d in range(0, k_cache.shape[3], 64 // k_cache.itemsize):
            prefetch(k_cache, s, j, kvh, d)
            prefetch(v_cache, s, j, kvh, d)


@njit(cache=True, nogil=True)
def _prefetch_at(k_cache, v_cache, tbl, j, kvh, end):
    """_prefetch_kv of cell j < end of the sequence whose block table row is tbl."""
    if j < end:
        bs = k_cache.shape[1]
        _prefetch_kv(k_cache, v_cache, tbl[j // bs], j % bs, kvh, end)


@njit(cache=True, nogil=True)
def _prefetch_rows(k_cache, v_cache, tbl, pg, base, a, b, kvh, end):
    """Prefetch cells [a, b) before end: those of block pg (cells base..base + B - 1)
    directly, the next block's through tbl."""
    bs = k_cache.shape[1]
    for j in range(a, min(b, end)):
        if j < base + bs:
            _prefetch_kv(k_cache, v_cache, pg, j - base, kvh, bs)
        else:
            _prefetch_at(k_cache, v_cache, tbl, j, kvh, end)


@njit(cache=True, nogil=True)
def _page(tbl, bs, j0, end):
    """Where key block [j0, ...) lives: (cache block, its row of j0, the cell limit `end` as a
    row of that block, capped at bs: prefetching stops at the block's end)."""
    off = j0 % bs
    return tbl[j0 // bs], off, min(end - (j0 - off), bs)


@intrinsic
def _as_c(typingctx, arr):
    """arr, typed C-contiguous (the same data model). Only for a view that is contiguous in
    fact: the cache is typed any-layout (model.KVCache stores it head by head), and loops
    over it in that type index with runtime strides, which LLVM does not vectorize."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, sig, args):
        return impl_ret_borrowed(context, builder, sig.return_type, args[0])

    return arr.copy(layout="C")(arr), codegen


@njit(cache=True, nogil=True)
def _is_c(rows):
    """Whether a 2-D view is C-contiguous in fact (typing aside)."""
    return rows.strides[1] == rows.itemsize and (
        rows.shape[0] < 2 or rows.strides[0] == rows.shape[1] * rows.itemsize)


@njit(cache=True, nogil=True, fastmath=FAST)
def _convert_rows(cache, s, j0, nb, kvh, dst):
    """dst[0, :nb, 0] = cache[s, j0:j0+nb, kvh] as float32."""
    rows = cache[s, j0 : j0 + nb, kvh]  # (nb, hd)
    if _is_c(rows):  # the head-major cache of model.KVCache (tests also pass C caches)
        rows_c = _as_c(rows)
        for jj in range(nb):
            for d in range(dst.shape[3]):
                dst[0, jj, 0, d] = f16_bits_to_f32(rows_c[jj, d])
        return
    for jj in range(nb):
        for d in range(dst.shape[3]):
            dst[0, jj, 0, d] = f16_bits_to_f32(cache[s, j0 + jj, kvh, d])


@njit(cache=True, nogil=True, fastmath=FAST)
def _scores4(qt, src, s, j0, kvh, ra, rb, rc, rd, a, b, sc, col, k_pf, v_pf, pf_end):
    """sc[r, col + jj] = qt[r] . K[jj] for jj in [a, b) and rows ra..rd (repeats allowed),
    K[jj] = src[s, j0 + jj, kvh] (F16 bits or f32). 4 rows x 4 keys per pass: 16 independent
    accumulators hide the FMA latency and each load feeds 4 FMAs. Cache rows PREFETCH_KEYS
    ahead (and before pf_end, 0: none) in k_pf and v_pf are prefetched. Head dimensions that
    fill whole vectors take attn_blocks.score_block, others these loops."""
    hd = qt.shape[1]
    jj = a
    if fits(hd):
        while jj < b:
            score_block(qt, ra, rb, rc, rd, src, s, j0, kvh, jj, min(4, b - jj), sc, col,
                        k_pf, v_pf, PREFETCH_KEYS if pf_end > 0 else 0)
            jj += 4
        return
    while jj + 4 <= b:
        for r in range(4 if pf_end > 0 else 0):
            _prefetch_kv(k_pf, v_pf, s, j0 + jj + PREFETCH_KEYS + r, kvh, pf_end)
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = np.float32(0.0)
        c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = np.float32(0.0)
        for d in range(hd):
            k0 = _f32(src[s, j0 + jj, kvh, d])
            k1 = _f32(src[s, j0 + jj + 1, kvh, d])
            k2 = _f32(src[s, j0 + jj + 2, kvh, d])
            k3 = _f32(src[s, j0 + jj + 3, kvh, d])
            x = qt[ra, d]
            a0 += x * k0
            a1 += x * k1
            a2 += x * k2
            a3 += x * k3
            x = qt[rb, d]
            b0 += x * k0
            b1 += x * k1
            b2 += x * k2
            b3 += x * k3
            x = qt[rc, d]
            c0 += x * k0
            c1 += x * k1
            c2 += x * k2
            c3 += x * k3
            x = qt[rd, d]
            d0 += x * k0
            d1 += x * k1
            d2 += x * k2
            d3 += x * k3
        o = col + jj
        sc[ra, o], sc[ra, o + 1], sc[ra, o + 2], sc[ra, o + 3] = a0, a1, a2, a3
        sc[rb, o], sc[rb, o + 1], sc[rb, o + 2], sc[rb, o + 3] = b0, b1, b2, b3
        sc[rc, o], sc[rc, o + 1], sc[rc, o + 2], sc[rc, o + 3] = c0, c1, c2, c3
        sc[rd, o], sc[rd, o + 1], sc[rd, o + 2], sc[rd, o + 3] = d0, d1, d2, d3
        jj += 4
    while jj < b:  # leftover keys: 4 rows x 1 key
        a0 = b0 = c0 = d0 = np.float32(0.0)
        for d in range(hd):
            k0 = _f32(src[s, j0 + jj, kvh, d])
            a0 += qt[ra, d] * k0
            b0 += qt[rb, d] * k0
            c0 += qt[rc, d] * k0
            d0 += qt[rd, d] * k0
        o = col + jj
        sc[ra, o], sc[rb, o], sc[rc, o], sc[rd, o] = a0, b0, c0, d0
        jj += 1


@njit(cache=True, nogil=True, fastmath=FAST)
def _accumulate4(acc, sc, col, src, s, j0, kvh, ra, rb, rc, rd, pa, pb, pc, pd, a, b):
    """acc[ra] += sum over jj in [a, b) of sc[pa, col + jj] * V[jj] (V[jj] = src[s, j0 + jj,
    kvh]), likewise for (rb, pb), (rc, pc), (rd, pd): 4 rows x 4 value rows per pass, one load
    and store of each acc row per 4 FMAs. The acc rows must be distinct (a spare row takes
    the place of a missing one), the P rows need not be. Head dimensions that fill whole
    vectors take attn_blocks.value_block (one FMA per key, in key order), others these
    loops."""
    hd = acc.shape[1]
    if fits(hd):
        value_block(acc, ra, rb, rc, rd, pa, pb, pc, pd, sc, col, src, s, j0, kvh, a, b)
        return
    jj = a
    while jj + 4 <= b:
        o = col + jj
        a0, a1, a2, a3 = sc[pa, o], sc[pa, o + 1], sc[pa, o + 2], sc[pa, o + 3]
        b0, b1, b2, b3 = sc[pb, o], sc[pb, o + 1], sc[pb, o + 2], sc[pb, o + 3]
        c0, c1, c2, c3 = sc[pc, o], sc[pc, o + 1], sc[pc, o + 2], sc[pc, o + 3]
        d0, d1, d2, d3 = sc[pd, o], sc[pd, o + 1], sc[pd, o + 2], sc[pd, o + 3]
        for d in range(hd):
            v0 = _f32(src[s, j0 + jj, kvh, d])
            v1 = _f32(src[s, j0 + jj + 1, kvh, d])
            v2 = _f32(src[s, j0 + jj + 2, kvh, d])
            v3 = _f32(src[s, j0 + jj + 3, kvh, d])
            acc[ra, d] += a0 * v0 + a1 * v1 + a2 * v2 + a3 * v3
            acc[rb, d] += b0 * v0 + b1 * v1 + b2 * v2 + b3 * v3
            acc[rc, d] += c0 * v0 + c1 * v1 + c2 * v2 + c3 * v3
            acc[rd, d] += d0 * v0 + d1 * v1 + d2 * v2 + d3 * v3
        jj += 4
    while jj < b:
        o = col + jj
        a0, b0, c0, d0 = sc[pa, o], sc[pb, o], sc[pc, o], sc[pd, o]
        for d in range(hd):
            v0 = _f32(src[s, j0 + jj, kvh, d])
            acc[ra, d] += a0 * v0
            acc[rb, d] += b0 * v0
            acc[rc, d] += c0 * v0
            acc[rd, d] += d0 * v0
        jj += 1


# ------------------------------------------------------------------------- one tile's phases


@njit(cache=True, nogil=True)
def _key_range(p, window):
    return (max(0, p - window + 1) if window > 0 else 0), p + 1


@njit(cache=True, nogil=True)
def _same_keys(positions, i0, t, nt, window, j0, j1):
    """The keys [a, b) (block-relative, a >= b: none) token t sees in block [j0, j1), and the
    end t1 of the run of tokens from t that see the same ones: one contiguous row range."""
    lo, hi = _key_range(positions[i0 + t], window)
    a, b = max(lo, j0) - j0, min(hi, j1) - j0
    t1 = t + 1
    while t1 < nt:
        lo, hi = _key_range(positions[i0 + t1], window)
        if max(lo, j0) - j0 != a or min(hi, j1) - j0 != b:
            break
        t1 += 1
    return min(a, j1 - j0), max(b, 0), t1


@njit(cache=True, nogil=True, fastmath=FAST)
def _tile_setup(q, positions, i0, nt, kvh, group, window, qt, round_q=True):
    """The tile's query rows (r = token * group + head in group) into qt, rounded to F16
    unless round_q is False; return the union [ka, kb) of the tokens' key ranges."""
    ka, kb = positions[i0] + 1, 0
    for t in range(nt):
        lo, hi = _key_range(positions[i0 + t], window)
        ka, kb = min(ka, lo), max(kb, hi)
        for g in range(group):
            for d in range(q.shape[2]):
                x = q[i0 + t, kvh * group + g, d]
                qt[t * group + g, d] = round_f16(x) if round_q else x
    return ka, kb


@njit(cache=True, nogil=True)
def _blocks(ka, kb, part, n_part):
    """The part-th of n_part slices of the key blocks (aligned to absolute positions) that
    cover [ka, kb)."""
    first, last = ka // KEY_BLOCK, (kb - 1) // KEY_BLOCK + 1
    return (first + (last - first) * part // n_part,
            first + (last - first) * (part + 1) // n_part)


@njit(cache=True, nogil=True, fastmath=FAST)
def _tile_scores(qt, k_cache, v_cache, kf, tbl, kvh, positions, i0, nt, group, window, ka, kb,
                 blk_lo, blk_hi, sc):
    """Raw dots of the tile rows with the keys they see in blocks [blk_lo, blk_hi), into
    sc[r, key - ka]; tbl: the sequence's block table row. A tile of <= 4 rows uses each key
    once: it reads the cache directly; bigger tiles convert each block to f32 once. Both
    prefetch K and V rows ahead."""
    direct = nt * group <= 4
    bs = k_cache.shape[1]
    end = min(blk_hi * KEY_BLOCK, kb)
    j = max(blk_lo * KEY_BLOCK, ka)
    for jj in range(j, min(j + PREFETCH_KEYS, end)):  # the loops below ask further ahead
        _prefetch_at(k_cache, v_cache, tbl, jj, kvh, end)
    for blk in range(blk_lo, blk_hi):
        j0, j1 = max(blk * KEY_BLOCK, ka), min(blk * KEY_BLOCK + KEY_BLOCK, kb)
        pg, off, pf_end = _page(tbl, bs, j0, end)
        base = j0 - off  # the cache block's first cell
        if not direct:
            _prefetch_rows(k_cache, v_cache, tbl, pg, base, j0 + PREFETCH_KEYS,
                           j1 + PREFETCH_KEYS, kvh, end)
            _convert_rows(k_cache, pg, off, j1 - j0, kvh, kf)
        elif j1 + PREFETCH_KEYS > base + bs:  # the next block's first rows: the loop below
            _prefetch_rows(k_cache, v_cache, tbl, pg, base, base + bs,  # stops at this one's
                           j1 + PREFETCH_KEYS, kvh, end)
        t = np.int64(0)  # not a literal: one compiled _same_keys (run_tasks says why)
        while t < nt:
            a, b, t1 = _same_keys(positions, i0, t, nt, window, j0, j1)
            last = t1 * group - 1
            for r in range(t * group, t1 * group, 4):
                rb, rc, rd = min(r + 1, last), min(r + 2, last), min(r + 3, last)
                if direct:
                    _scores4(qt, k_cache, pg, off, kvh, r, rb, rc, rd, a, b, sc, j0 - ka,
                             k_cache, v_cache, pf_end)
                else:
                    _scores4(qt, kf, 0, 0, 0, r, rb, rc, rd, a, b, sc, j0 - ka, k_cache,
                             v_cache, 0)
            t = t1


@njit(cache=True, nogil=True)
def _tile_softmax(sc, scale, positions, i0, group, window, ka, r_lo, r_hi):
    """Rows [r_lo, r_hi) of sc: raw dots -> F16-rounded probabilities over each row's keys."""
    for r in range(r_lo, r_hi):
        lo, hi = _key_range(positions[i0 + r // group], window)
        _softmax_row(sc[r, lo - ka : hi - ka], scale)


@njit(cache=True, nogil=True, fastmath=FAST)
def _tile_values(acc, sc, v_cache, kf, tbl, kvh, positions, i0, nt, group, window, ka, kb,
                 blk_lo, blk_hi):
    """acc[r] = P[r] @ V over the tile rows' keys in blocks [blk_lo, blk_hi); tbl: the
    sequence's block table row."""
    bs = v_cache.shape[1]
    spare = acc.shape[0] - 1  # rows past a run go to the 3 spare rows, never read
    acc[: nt * group] = 0.0  # acc is sized for the longest tile: zero only the rows used
    acc[spare - 2 :] = 0.0
    direct = nt * group <= 4
    for blk in range(blk_lo, blk_hi):
        j0, j1 = max(blk * KEY_BLOCK, ka), min(blk * KEY_BLOCK + KEY_BLOCK, kb)
        pg, off = tbl[j0 // bs], j0 % bs
        if not direct:
            _convert_rows(v_cache, pg, off, j1 - j0, kvh, kf)
        t = np.int64(0)  # not a literal: one compiled _same_keys (run_tasks says why)
        while t < nt:
            a, b, t1 = _same_keys(positions, i0, t, nt, window, j0, j1)
            last = t1 * group - 1
            for r in range(t * group, t1 * group, 4):
                rb = r + 1 if r + 1 <= last else spare
                rc = r + 2 if r + 2 <= last else spare - 1
                rd = r + 3 if r + 3 <= last else spare - 2
                pb, pc, pd = min(r + 1, last), min(r + 2, last), min(r + 3, last)
                if direct:
                    _accumulate4(acc, sc, j0 - ka, v_cache, pg, off, kvh, r, rb, rc, rd, r,
                                 pb, pc, pd, a, b)
                else:
                    _accumulate4(acc, sc, j0 - ka, kf, 0, 0, 0, r, rb, rc, rd, r, pb, pc, pd,
                                 a, b)
            t = t1


@njit(cache=True, nogil=True, fastmath=FAST)
def _run_item(w, n_items, chunk, q, k_cache, v_cache, slots, tables, positions, window, scale,
              buf, out):
    """Work item w: batch rows [c*chunk, (c+1)*chunk) (runs of one slot each) x KV head kvh."""
    n, n_head, hd = q.shape
    n_ctx, n_kv = tables.shape[1] * k_cache.shape[1], k_cache.shape[2]
    group = n_head // n_kv
    c, kvh = _work_item(w, n_items, n_kv)
    qt, acc, kf, sc = _thread_scratch(buf, _tile_tokens(group, n_ctx) * group, hd, n_ctx)
    i = c * chunk
    end = min(n, i + chunk)
    while i < end:
        i1 = i + 1
        while i1 < end and slots[i1] == slots[i]:
            i1 += 1
        tbl, nt = tables[slots[i]], i1 - i
        ka, kb = _tile_setup(q, positions, i, nt, kvh, group, window, qt)
        blk_lo, blk_hi = _blocks(ka, kb, 0, 1)
        _tile_scores(qt, k_cache, v_cache, kf, tbl, kvh, positions, i, nt, group, window, ka, kb,
                     blk_lo, blk_hi, sc)
        _tile_softmax(sc, scale, positions, i, group, window, ka, 0, nt * group)
        first, end_seg = _segments(ka, kb)
        for seg in range(first, end_seg):  # out = seg_0 + seg_1 + ..., in order
            seg_lo, seg_hi = _segment_blocks(seg, ka, kb)
            _tile_values(acc, sc, v_cache, kf, tbl, kvh, positions, i, nt, group, window, ka,
                         kb, seg_lo, seg_hi)
            for t in range(nt):  # a row outside the segment adds exact zeros
                for g in range(group):
                    row, head = t * group + g, kvh * group + g
                    for d in range(hd):
                        if seg == first:
                            out[i + t, head, d] = acc[row, d]
                        else:
                            out[i + t, head, d] += acc[row, d]
        i = i1


@njit(cache=True, nogil=True)
def _plan(positions, window, n_head, n_kv, hd, tile):
    """How a call splits: (parallel, tokens per work item, work items, longest key range,
    key ranges per row). Below SERIAL_MACS multiply-adds (q.k and p.v), waking the other
    threads costs more than it saves. In parallel, small batches get smaller tiles so every
    thread has work, and few long rows (decode) have their keys split (_split_parts)."""
    n = positions.shape[0]
    # numba.get_num_threads() inside a kernel goes through a ctypes pointer, which stops
    # caching; its intrinsic calls the same C function by name.
    n_thr = _iget_num_threads()
    macs, longest = 0, 0
    for i in range(n):
        lo, hi = _key_range(positions[i], window)
        macs += 2 * (hi - lo) * n_head * hd
        longest = max(longest, hi - lo)
    parallel = n_thr > 1 and macs >= SERIAL_MACS
    chunk = max(1, min(tile, n // (2 * n_thr))) if parallel else tile
    n_items = (n + chunk - 1) // chunk * n_kv
    n_part = _split_parts(n_items, longest) if parallel else 1
    return parallel, chunk, n_items, longest, n_part


@njit(cache=True, nogil=True)
def _split_parts(n_items, longest):
    """Key ranges per row when few long rows (decode) are split across the threads; 1: none."""
    n_thr = _iget_num_threads()
    if n_thr > 1 and n_items < 2 * n_thr and longest >= 2 * SPLIT_MIN_KEYS:
        return min((2 * n_thr + n_items - 1) // n_items, longest // SPLIT_MIN_KEYS)
    return 1


# The task functions' modes: one thread's share of the work items (then help with the
# others'), or one task of a decode split's phases, which run in this order: the key
# ranges' scores, then per row and head (attention's softmax, flash's merge), then the key
# ranges' values (attention only)
RUN_ITEMS, SPLIT_SCORES, SPLIT_ROWS, SPLIT_VALUES = 0, 1, 2, 3


@njit(cache=True, nogil=True, fastmath=FAST)
def attention_task(mode, task, counters, n_seg, n_items, chunk, n_part, longest, q, k_cache,
                   v_cache, slots, tables, positions, window, scale, work, split, out):
    """Task `task` of an attention call's parallel loop (or, with n_seg 1, all the items of
    a serial call). Reached through its native address: a prange compiles its body apart,
    with all it calls inlined and optimized again, which for the four loops this kernel had
    took 12 s of a first run's compile (kernels/native.py)."""
    n, n_head, hd = q.shape
    n_ctx, n_kv = tables.shape[1] * k_cache.shape[1], k_cache.shape[2]
    group = n_head // n_kv
    tile = _tile_tokens(group, n_ctx)
    buf = work[get_thread_id()]
    if mode == RUN_ITEMS:
        w, k = next_chunk(counters, task, np.int64(0), n_items, n_seg)
        while w >= 0:
            _run_item(w, n_items, chunk, q, k_cache, v_cache, slots, tables, positions, window,
                      scale, buf, out)
            w, k = next_chunk(counters, task, k, n_items, n_seg)
        return
    # Few long rows (decode): each row's keys split into n_part ranges across the threads
    # (chunk == 1); scores, softmax and P·V are three parallel phases over shared scores.
    n_sc, n_segs = n * n_head * longest, _max_segments(longest)
    sc_all = split[:n_sc].reshape((n, n_head, longest))
    seg_acc = split[n_sc : n_sc + n_segs * n * n_head * hd].reshape((n_segs, n, n_head, hd))
    one = np.int64(1)  # run_tasks says why
    if mode == SPLIT_ROWS:  # the softmax of row i, head task % n_head
        i = task // n_head
        lo, hi = _key_range(positions[i], window)
        _softmax_row(sc_all[i, task % n_head, : hi - lo], scale)
        return
    i, kvh, part = task // (n_kv * n_part), task // n_part % n_kv, task % n_part
    qt, acc, kf, _ = _thread_scratch(buf, tile * group, hd, n_ctx)
    scores = sc_all[i, kvh * group : kvh * group + group]
    if mode == SPLIT_SCORES:
        ka, kb = _tile_setup(q, positions, i, one, kvh, group, window, qt)
        blk_lo, blk_hi = _blocks(ka, kb, part, n_part)
        _tile_scores(qt, k_cache, v_cache, kf, tables[slots[i]], kvh, positions, i, one, group,
                     window, ka, kb, blk_lo, blk_hi, scores)
    else:  # this part's share of the row's segments, each one's sums kept apart
        ka, kb = _key_range(positions[i], window)
        first, end_seg = _segments(ka, kb)
        for seg in range(first + (end_seg - first) * part // n_part,
                         first + (end_seg - first) * (part + 1) // n_part):
            seg_lo, seg_hi = _segment_blocks(seg, ka, kb)
            _tile_values(acc, scores, v_cache, kf, tables[slots[i]], kvh, positions, i, one,
                         group, window, ka, kb, seg_lo, seg_hi)
            for g in range(group):
                seg_acc[seg - first, i, kvh * group + g] = acc[g]


@njit(cache=True, nogil=True)
def _sum_segments(split, positions, window, longest, out):
    """out = the sum of a decode split's per-segment outputs, in segment order: the order
    _run_item adds them in."""
    n, n_head, hd = out.shape
    n_sc, n_segs = n * n_head * longest, _max_segments(longest)
    seg_acc = split[n_sc : n_sc + n_segs * n * n_head * hd].reshape((n_segs, n, n_head, hd))
    for i in range(n):  # loops, not array expressions: those compile for a second longer
        ka, kb = _key_range(positions[i], window)
        first, end_seg = _segments(ka, kb)
        for h in range(n_head):
            for d in range(hd):
                total = seg_acc[0, i, h, d]
                for seg in range(1, end_seg - first):
                    total += seg_acc[seg, i, h, d]
                out[i, h, d] = total


@njit(parallel=True, cache=True, nogil=True)
def run_tasks(task, n_phases, parallel, n_part, n_items, chunk, longest, q, k_cache, v_cache,
              slots, tables, positions, window, scale, work, split, out):
    """The parallel loops of attention and flash_attention, each task done by the kernel's
    task function at address `task` (attention_task, flash.flash_task): with n_part > 1 a
    decode split's phases SPLIT_SCORES .. n_phases; else the work items, each thread its
    own, then helping with the others' (schedule.py), or all on this thread."""
    n, n_head = q.shape[0], q.shape[1]
    # Helpers get np.int64 where a constant or prange's uint64 index would compile them (and
    # what they call) a second time, for that type: 6 s of a first run's compile.
    counters, zero = chunk_counters(), np.int64(0)
    if n_part > 1:
        for mode in range(SPLIT_SCORES, n_phases + 1):
            n_tasks = n * n_head if mode == SPLIT_ROWS else n_items * n_part
            for t in prange(n_tasks):
                call("attention_task", task, (np.int64(mode), np.int64(t), counters, zero,
                                              n_items, chunk, n_part, longest, q, k_cache,
                                              v_cache, slots, tables, positions, window,
                                              scale, work, split, out))
    elif parallel:
        n_seg = n_workers(n_items)
        for t in prange(n_seg):
            call("attention_task", task, (np.int64(RUN_ITEMS), np.int64(t), counters, n_seg,
                                          n_items, chunk, n_part, longest, q, k_cache, v_cache,
                                          slots, tables, positions, window, scale, work, split,
                                          out))
    else:
        call("attention_task", task, (np.int64(RUN_ITEMS), zero, counters, np.int64(1),
                                      n_items, chunk, n_part, longest, q, k_cache, v_cache,
                                      slots, tables, positions, window, scale, work, split,
                                      out))


@njit(cache=True, nogil=True)
def attention(q, k_cache, v_cache, slots, tables, positions, window, scale, scores, shared, out,
              task):
    """q (n, n_head, hd) f32 (left unchanged); k_cache/v_cache (n_blocks, B, n_kv, hd)
    uint16 F16 bits; slots/positions (n,) int32; tables (n_slots, n_ctx / B) int32, each
    slot's cache blocks; scores (n_threads, m) f32 per-thread scratch,
    allocated here when m < scratch_floats(...); shared (k,) f32 scratch of the decode split,
    allocated here when k < shared_floats(...); out (n, n_head, hd) f32; task: the native
    address of attention_task (task_address()), which does the work."""
    n, n_head, hd = q.shape
    n_ctx, n_kv = tables.shape[1] * k_cache.shape[1], k_cache.shape[2]
    group = n_head // n_kv
    tile = _tile_tokens(group, n_ctx)
    parallel, chunk, n_items, longest, n_part = _plan(positions, window, n_head, n_kv, hd, tile)
    need = _scratch_floats(tile * group, hd, n_ctx)
    work = scores if scores.shape[1] >= need else np.empty((scores.shape[0], need), np.float32)
    split = shared
    if n_part > 1:  # the rows' scores, then each segment's value sums
        size = n * n_head * longest + _max_segments(longest) * n * n_head * hd
        split = shared if shared.shape[0] >= size else np.empty(size, np.float32)
    run_tasks(task, np.int64(SPLIT_VALUES), parallel, n_part, n_items, chunk, longest, q,
              k_cache, v_cache, slots, tables, positions, window, scale, work, split, out)
    if n_part > 1:
        _sum_segments(split, positions, window, longest, out)


def key_ranges(positions, window: int, n_head: int, n_kv: int, head_dim: int, n_ctx: int,
               flash: bool = False) -> int:
    """Key ranges per row that attention (flash_attention when flash) splits the keys of
    rows at `positions` into on this thread's numba thread count; 1: not split. The kernels'
    own plan (_plan), for the tests that check a split happens."""
    tile = TILE_TOKENS if flash else _tile_tokens(n_head // n_kv, n_ctx)
    positions = np.ascontiguousarray(positions, np.int32)
    return int(_plan(positions, np.int64(window), np.int64(n_head), np.int64(n_kv),
                     np.int64(head_dim), np.int64(tile))[4])


def task_address() -> int:
    """attention_task's native address, for attention's last argument."""
    return native.address(attention_task, "attention_task")


@njit(cache=True, nogil=True)
def store_kv(k, v, slots, tables, positions, k_cache, v_cache):
    """Write this batch's K and V (n, n_kv, hd) f32 into the cache as F16, before attention
    reads them (llama.cpp copies into the cache first, so the current token is F16 too):
    cell p of slot s is row p % B of block tables[s, p // B]."""
    n, n_kv, hd = k.shape
    bs = k_cache.shape[1]
    for i in range(n):
        p = positions[i]
        blk, row = tables[slots[i], p // bs], p % bs
        for h in range(n_kv):
            _store_row(k[i, h], k_cache[blk, row, h : h + 1])
            _store_row(v[i, h], v_cache[blk, row, h : h + 1])


@njit(cache=True, nogil=True, inline="always")
def _store_row(x, dst):
    """dst[0, :] = x (hd,) as F16 bits; dst (1, hd) a cache row, contiguous in fact, typed so
    the conversions vectorize (fcvtn / vcvtps2ph)."""
    if _is_c(dst):
        row = _as_c(dst)
        for d in range(x.shape[0]):
            row[0, d] = f32_to_f16_bits(x[d])
    else:
        for d in range(x.shape[0]):
            dst[0, d] = f32_to_f16_bits(x[d])
