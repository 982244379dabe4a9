"""Flash attention: causal grouped-query attention over the F16 KV cache with an online softmax.

One pass over the keys, a block of KEY_BLOCK at a time: each row keeps its running maximum M,
its running sum S and its output accumulator, rescaled whenever M grows, and no row of scores
is kept, so the scratch is the same at any context length (`attention.py` keeps each tile's
raw scores and shrinks its tiles past SCORE_BUDGET). Tiles, key blocks, work items and the
key split of lone long decode rows are `attention.py`'s, and so are its 4 x 4 blocks.

Numerics are llama.cpp's flash-attention path (`ggml_compute_forward_flash_attn_ext_f16`),
which its tools use by default on a CPU (`-fa auto`). As
there, they depend on how many query tokens the call has:

- at least FA_TILE_Q (prefill; its "tiled" path): Q stays f32; per block of keys, scores
  x*scale, the block maximum, a rescale of the accumulator and S by expf(M_old - M_new) when
  it grows, P = expf(x - M) in f32 summed in double into S, acc += P·V in f32;
- fewer (decode and batched decode; its "one chunk" path): Q rounded to F16, then key by key:
  a new maximum rescales the accumulator (rounded to F16), else P = expf(x - M); the
  accumulator += P·v is rounded to F16 after every key (`ggml_vec_mad_f16`); S = S*ms + P.

Both end with acc * (1/S). A lone long decode row whose keys are split across threads merges
its parts' (M, S, acc) in f32 as `ggml_flash_attn_ext_reduce_partials` does (llama.cpp splits
only one-token batches of >= 512 cells, at cells/threads; here, by attention.py's rule).
Only f32 summation orders and those split points differ from ggml's.
"""

from __future__ import annotations

import numpy as np
from numba import get_thread_id, njit

from edgeinfer.kernels import native
from edgeinfer.kernels.attention import (
    FAST,
    KEY_BLOCK,
    PREFETCH_KEYS,
    RUN_ITEMS,
    SPLIT_ROWS,
    TILE_TOKENS,
    _accumulate4,
    _blocks,
    _convert_rows,
    _f32,
    _page,
    _plan,
    _prefetch_at,
    _prefetch_rows,
    _same_keys,
    _scaled_max,
    _scores4,
    _tile_setup,
    _tile_views,
    _work_item,
    run_tasks,
)
from edgeinfer.kernels.attn_blocks import fits, value_block_f16
from edgeinfer.kernels.expf import expf
from edgeinfer.kernels.f16 import round_f16
from edgeinfer.kernels.schedule import next_chunk

FA_TILE_Q = 64  # GGML_FA_TILE_Q: calls with this many query tokens take the f32 path


def flash_scratch_floats(n_head: int, n_head_kv: int, head_dim: int) -> int:
    """float32s of per-thread scratch `flash_attention` needs in each row of `scratch`."""
    return int(_flash_floats(TILE_TOKENS * (n_head // n_head_kv), head_dim))


@njit(cache=True, nogil=True)
def _flash_floats(rows, hd):
    return rows * hd + (rows + 3) * hd + KEY_BLOCK * hd + 2 * rows * KEY_BLOCK + 2 * rows


@njit(cache=True, nogil=True)
def _flash_scratch(buf, rows, hd):
    """One thread's views: attention._tile_views, then the rows' scores of one key block
    (then weights) and the F16 path's rescale factors, and their running M and S."""
    qt, acc, kf, off = _tile_views(buf, rows, hd)
    sc = buf[off : off + rows * KEY_BLOCK].reshape((rows, KEY_BLOCK))
    off += rows * KEY_BLOCK
    rs = buf[off : off + rows * KEY_BLOCK].reshape((rows, KEY_BLOCK))
    off += rows * KEY_BLOCK
    return qt, acc, kf, sc, rs, buf[off : off + rows], buf[off + rows : off + 2 * rows]


# ---------------------------------------------------------------- one row's online softmax


@njit(cache=True, nogil=True, fastmath=FAST)
def _online_f32(x, scale, acc, m, s, r):
    """The f32 path's softmax step for one row and one block of raw dots x (a view): rescale
    acc[r] and s[r] if the block raises the maximum m[r]; x becomes P = expf(x*scale - M)."""
    n = x.shape[0]
    m_old = m[r]
    m_new = max(m_old, _scaled_max(x, scale))
    if m_new > m_old:
        ms = expf(m_old - m_new)
        for d in range(acc.shape[1]):
            acc[r, d] *= ms
        s[r] *= ms
    m[r] = m_new
    for k in range(n):
        x[k] = expf(x[k] - m_new)
    total = 0.0  # double, as ggml_vec_soft_max_f32 returns it
    for k in range(n):
        total += x[k]
    s[r] = np.float32(s[r] + total)


@njit(cache=True, nogil=True, fastmath=FAST)
def _online_f16_weights(x, scale, rescale, m, s, r):
    """The F16 path's scalar part for one row over raw dots x (a view), key by key: x becomes
    the weight P of each key's value row and rescale[k] the factor the accumulator takes
    before it (1: none); m[r], s[r] run on."""
    m_run, s_run = m[r], s[r]
    for k in range(x.shape[0]):
        xs = x[k] * scale
        ms = np.float32(1.0)
        vs = np.float32(1.0)
        if xs > m_run:
            ms = expf(m_run - xs)
            m_run = xs
        else:
            vs = expf(xs - m_run)
        x[k], rescale[k] = vs, ms
        s_run = s_run * ms + vs
    m[r], s[r] = m_run, s_run


@njit(cache=True, nogil=True, fastmath=FAST)
def _rescale_f16(acc, r, ms):
    for d in range(acc.shape[1]):
        acc[r, d] = round_f16(acc[r, d] * ms)


@njit(cache=True, nogil=True, fastmath=FAST)
def _accumulate4_f16(acc, sc, rs, src, sl, j0, kvh, ra, rb, rc, rd, pa, pb, pc, pd, a, b):
    """For keys k in [a, b) in order: acc[ra] = F16(acc[ra] * rs[pa, k]) when that is not 1,
    then acc[ra] = F16(acc[ra] + sc[pa, k] * V[k]) (V[k] = src[sl, j0 + k, kvh]); likewise
    (rb, pb), (rc, pc), (rd, pd). The acc rows must be distinct (a spare row takes the place
    of a missing one): their F16 round trips are then 4 independent chains, where one row
    alone is latency-bound on its own. Head dimensions that fill whole vectors take
    attn_blocks.value_block_f16 (the same operations, accumulators in registers)."""
    hd = acc.shape[1]
    if fits(hd):
        value_block_f16(acc, ra, rb, rc, rd, pa, pb, pc, pd, sc, 0, src, sl, j0, kvh, a, b, rs)
        return
    for k in range(a, b):
        for r, p in ((ra, pa), (rb, pb), (rc, pc), (rd, pd)):
            if rs[p, k] != 1.0:
                _rescale_f16(acc, r, rs[p, k])
        wa, wb, wc, wd = sc[pa, k], sc[pb, k], sc[pc, k], sc[pd, k]
        for d in range(hd):
            v = _f32(src[sl, j0 + k, kvh, d])
            acc[ra, d] = round_f16(acc[ra, d] + v * wa)
            acc[rb, d] = round_f16(acc[rb, d] + v * wb)
            acc[rc, d] = round_f16(acc[rc, d] + v * wc)
            acc[rd, d] = round_f16(acc[rd, d] + v * wd)


# ------------------------------------------------------------------------------ one tile


@njit(cache=True, nogil=True, fastmath=FAST)
def _flash_block_scores(qt, src, sl, jsrc, kvh, positions, i0, nt, group, window, j0, j1, sc,
                        v_pf, pf_end):
    """sc[r, a:b] = raw dots of tile row r with the keys j0 + [a, b) it sees in block
    [j0, j1); key j0 + jj is src[sl, jsrc + jj, kvh] (the cache with jsrc = j0, or a converted
    block with sl = jsrc = kvh = 0). With pf_end > 0, src is the K cache and rows ahead of the
    ones read (before pf_end) are prefetched from it and from the V cache v_pf."""
    t = 0
    while t < nt:
        a, b, t1 = _same_keys(positions, i0, t, nt, window, j0, j1)
        last = t1 * group - 1
        for r in range(t * group, t1 * group, 4):
            rb, rc, rd = min(r + 1, last), min(r + 2, last), min(r + 3, last)
            _scores4(qt, src, sl, jsrc, kvh, r, rb, rc, rd, a, b, sc, 0, src, v_pf, pf_end)
        t = t1


@njit(cache=True, nogil=True, fastmath=FAST)
def _flash_tile(qt, acc, kf, sc, rs, m, s, k_cache, v_cache, tbl, kvh, positions, i0, nt,
                group, window, ka, kb, blk_lo, blk_hi, scale, f16_path):
    """acc, m, s of the tile rows after the keys they see in blocks [blk_lo, blk_hi):
    unnormalised outputs, maxima and sums; tbl: the sequence's block table row. Tiles of
    <= 4 rows read the cache directly, bigger ones convert each block of K and of V to f32
    once."""
    bs = k_cache.shape[1]
    rows = nt * group
    acc[:] = 0.0
    m[:] = -np.inf
    s[:] = 0.0
    spare = acc.shape[0] - 1  # rows past a run go to the 3 spare rows, never read
    direct = rows <= 4
    end = min(blk_hi * KEY_BLOCK, kb)
    j = max(blk_lo * KEY_BLOCK, ka)
    for jj in range(j, min(j + PREFETCH_KEYS, end)):
        _prefetch_at(k_cache, v_cache, tbl, jj, kvh, end)
    for blk in range(blk_lo, blk_hi):
        j0, j1 = max(blk * KEY_BLOCK, ka), min(blk * KEY_BLOCK + KEY_BLOCK, kb)
        sl, off, pf_end = _page(tbl, bs, j0, end)
        base = j0 - off  # the cache block's first cell
        if direct:
            if j1 + PREFETCH_KEYS > base + bs:  # the next block's first rows
                _prefetch_rows(k_cache, v_cache, tbl, sl, base, base + bs, j1 + PREFETCH_KEYS,
                               kvh, end)
            _flash_block_scores(qt, k_cache, sl, off, kvh, positions, i0, nt, group, window,
                                j0, j1, sc, v_cache, pf_end)
        else:
            _prefetch_rows(k_cache, v_cache, tbl, sl, base, j0 + PREFETCH_KEYS,
                           j1 + PREFETCH_KEYS, kvh, end)
            _convert_rows(k_cache, sl, off, j1 - j0, kvh, kf)
            _flash_block_scores(qt, kf, 0, 0, 0, positions, i0, nt, group, window, j0, j1, sc,
                                kf, 0)
            _convert_rows(v_cache, sl, off, j1 - j0, kvh, kf)
        t = np.int64(0)  # not a literal (attention.run_tasks says why)
        while t < nt:
            a, b, t1 = _same_keys(positions, i0, t, nt, window, j0, j1)
            if a < b:
                for r in range(t * group, t1 * group):
                    if f16_path:
                        _online_f16_weights(sc[r, a:b], scale, rs[r, a:b], m, s, r)
                    else:
                        _online_f32(sc[r, a:b], scale, acc, m, s, r)
                last = t1 * group - 1
                for r in range(t * group, t1 * group, 4):
                    rb = r + 1 if r + 1 <= last else spare
                    rc = r + 2 if r + 2 <= last else spare - 1
                    rd = r + 3 if r + 3 <= last else spare - 2
                    pb, pc, pd = min(r + 1, last), min(r + 2, last), min(r + 3, last)
                    if f16_path:
                        if direct:
                            _accumulate4_f16(acc, sc, rs, v_cache, sl, off, kvh, r, rb, rc,
                                             rd, r, pb, pc, pd, a, b)
                        else:
                            _accumulate4_f16(acc, sc, rs, kf, 0, 0, 0, r, rb, rc, rd, r, pb,
                                             pc, pd, a, b)
                    else:
                        if direct:
                            _accumulate4(acc, sc, 0, v_cache, sl, off, kvh, r, rb, rc, rd, r,
                                         pb, pc, pd, a, b)
                        else:
                            _accumulate4(acc, sc, 0, kf, 0, 0, 0, r, rb, rc, rd, r, pb, pc,
                                         pd, a, b)
            t = t1


@njit(cache=True, nogil=True)
def _normalise(acc, s, out_row, r):
    inv = np.float32(0.0) if s[r] == 0.0 else np.float32(1.0) / s[r]
    for d in range(acc.shape[1]):
        out_row[d] = acc[r, d] * inv


@njit(cache=True, nogil=True, fastmath=FAST)
def _flash_item(w, n_items, chunk, q, k_cache, v_cache, slots, tables, positions, window, scale,
                f16_path, buf, out):
    """Work item w: batch rows [c*chunk, (c+1)*chunk) (runs of one slot each) x KV head kvh."""
    n, n_head, hd = q.shape
    n_kv = k_cache.shape[2]
    group = n_head // n_kv
    c, kvh = _work_item(w, n_items, n_kv)
    qt, acc, kf, sc, rs, m, s = _flash_scratch(buf, TILE_TOKENS * group, hd)
    i = c * chunk
    end = min(n, i + chunk)
    while i < end:
        i1 = i + 1
        while i1 < end and slots[i1] == slots[i]:  # chunk <= TILE_TOKENS
            i1 += 1
        nt = i1 - i
        ka, kb = _tile_setup(q, positions, i, nt, kvh, group, window, qt, f16_path)
        blk_lo, blk_hi = _blocks(ka, kb, 0, 1)
        _flash_tile(qt, acc, kf, sc, rs, m, s, k_cache, v_cache, tables[slots[i]], kvh,
                    positions, i, nt, group, window, ka, kb, blk_lo, blk_hi, scale, f16_path)
        for t in range(nt):
            for g in range(group):
                _normalise(acc, s, out[i + t, kvh * group + g], t * group + g)
        i = i1


@njit(cache=True, nogil=True, fastmath=FAST)
def _merge_parts(part_acc, part_m, part_s, i, h, out_row):
    """ggml_flash_attn_ext_reduce_partials for row i, head h: the parts' (M, S, acc) merged
    in order, then divided by the sum."""
    m_fin, s_fin = np.float32(-np.inf), np.float32(0.0)
    out_row[:] = 0.0
    for part in range(part_acc.shape[0]):
        m_c, s_c = part_m[part, i, h], part_s[part, i, h]
        if s_c == 0.0:
            continue
        m_new = max(m_fin, m_c)
        scale_old, scale_new = expf(m_fin - m_new), expf(m_c - m_new)
        for d in range(out_row.shape[0]):
            out_row[d] = out_row[d] * scale_old + part_acc[part, i, h, d] * scale_new
        s_fin = s_fin * scale_old + s_c * scale_new
        m_fin = m_new
    if s_fin != 0.0:
        inv = np.float32(1.0) / s_fin
        for d in range(out_row.shape[0]):
            out_row[d] *= inv


@njit(cache=True, nogil=True, fastmath=FAST)
def flash_task(mode, task, counters, n_seg, n_items, chunk, n_part, longest, q, k_cache,
               v_cache, slots, tables, positions, window, scale, work, split, out):
    """Task `task` of a flash_attention call's parallel loop (all the items of a serial call
    with n_seg 1), as attention.attention_task: RUN_ITEMS, or a decode split's SPLIT_SCORES
    (one key range's (M, S, acc)) and SPLIT_ROWS (one row and head's merge)."""
    n, n_head, hd = q.shape
    n_kv = k_cache.shape[2]
    group = n_head // n_kv
    f16_path = n < FA_TILE_Q
    buf = work[get_thread_id()]
    if mode == RUN_ITEMS:
        w, k = next_chunk(counters, task, np.int64(0), n_items, n_seg)
        while w >= 0:
            _flash_item(w, n_items, chunk, q, k_cache, v_cache, slots, tables, positions,
                        window, scale, f16_path, buf, out)
            w, k = next_chunk(counters, task, k, n_items, n_seg)
        return
    part_acc, part_m, part_s = _split_views(split, n_part, n, n_head, hd)
    if mode == SPLIT_ROWS:
        _merge_parts(part_acc, part_m, part_s, task // n_head, task % n_head,
                     out[task // n_head, task % n_head])
        return
    one = np.int64(1)  # not a literal, nor prange's uint64: attention.run_tasks says why
    i, kvh, part = task // (n_kv * n_part), task // n_part % n_kv, task % n_part
    qt, acc, kf, sc, rs, m, s = _flash_scratch(buf, TILE_TOKENS * group, hd)
    ka, kb = _tile_setup(q, positions, i, one, kvh, group, window, qt, f16_path)
    blk_lo, blk_hi = _blocks(ka, kb, part, n_part)
    _flash_tile(qt, acc, kf, sc, rs, m, s, k_cache, v_cache, tables[slots[i]], kvh, positions,
                i, one, group, window, ka, kb, blk_lo, blk_hi, scale, f16_path)
    for g in range(group):
        h = kvh * group + g
        part_acc[part, i, h] = acc[g]
        part_m[part, i, h], part_s[part, i, h] = m[g], s[g]


@njit(cache=True, nogil=True)
def _split_views(split, n_part, n, n_head, hd):
    """A decode split's per-range (acc, M, S) in `split`."""
    n_pa, n_ms = n_part * n * n_head * hd, n_part * n * n_head
    return (split[:n_pa].reshape((n_part, n, n_head, hd)),
            split[n_pa : n_pa + n_ms].reshape((n_part, n, n_head)),
            split[n_pa + n_ms : n_pa + 2 * n_ms].reshape((n_part, n, n_head)))


@njit(cache=True, nogil=True)
def flash_attention(q, k_cache, v_cache, slots, tables, positions, window, scale, scratch,
                    shared, out, task):
    """As attention.attention, with an online softmax: q (n, n_head, hd) f32 (unchanged);
    k_cache/v_cache (n_blocks, B, n_kv, hd) uint16 F16 bits; slots/positions (n,) int32;
    tables (n_slots, n_ctx / B) int32, each slot's cache blocks;
    scratch (n_threads, m) f32, allocated here when m < flash_scratch_floats(...); shared (k,)
    f32 scratch of the decode split, allocated here when k < shared_floats(...); out
    (n, n_head, hd) f32; task: flash_task's native address (task_address())."""
    n, n_head, hd = q.shape
    n_kv = k_cache.shape[2]
    group = n_head // n_kv
    parallel, chunk, n_items, longest, n_part = _plan(positions, window, n_head, n_kv, hd,
                                                      TILE_TOKENS)
    need = _flash_floats(TILE_TOKENS * group, hd)
    work = scratch if scratch.shape[1] >= need else np.empty((scratch.shape[0], need),
                                                             np.float32)
    split = shared
    if n_part > 1:
        # Few long rows (decode): each row's keys in parts across the threads (chunk == 1),
        # each part's (M, S, acc) kept, then merged.
        size = n_part * n * n_head * (hd + 2)
        split = shared if shared.shape[0] >= size else np.empty(size, np.float32)
    run_tasks(task, np.int64(SPLIT_ROWS), parallel, n_part, n_items, chunk, longest, q,
              k_cache, v_cache, slots, tables, positions, window, scale, work, split, out)


def task_address() -> int:
    """flash_task's native address, for flash_attention's last argument."""
    return native.address(flash_task, "attention_task")
