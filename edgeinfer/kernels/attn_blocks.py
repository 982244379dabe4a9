"""Attention's 4-row register blocks, written as explicit vector IR.

`attention.py` and `flash.py` spend their time in two small products per tile and key block:
scores (4 query rows x 4 keys, dot products over the head dimension) and values (4 rows of
accumulators += P x V rows). Left to LLVM's loop vectorizer, the dot products ended in 16
separate horizontal sums and the value accumulators went through memory on every key: 3.5
multiply-adds per cycle where the FMA units allow 32. Here:

- `score_block`: the head dimension in chunks of LANES floats, 16 vector accumulators (4 rows
  x 4 keys), then one transposing reduction tree (15 shuffle pairs and adds) that leaves the
  16 dot products in one vector, stored 4 per row.
- `value_block`: up to 4 chunks x 4 rows of accumulators stay in registers across the keys,
  each key's value chunk is loaded once and multiplied by the 4 rows' weights.
- `value_block_f16`: the same for flash attention's F16 path, whose accumulators are rounded
  to F16 after every key (and every rescale): in registers, a full-width round trip per
  vector, where the loop vectorizer went through memory on half-width vectors.

Sources are the F16 cache (uint16 bits, converted on load) or a block already converted to
float32, both indexed [slot, cell, kv head, d]; the head dimension must be a multiple of
LANES (`fits`), else the kernels keep their loops. Sums run in f32, each dot product in its
own fixed order (chunks in turn, then the tree), whichever source it reads: a token decoded
alone gets the same scores as inside a prefill tile.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from edgeinfer.kernels.f16 import f32_to_half, half_to_f32
from edgeinfer.kernels.target import CPU_FEATURES

LANES = 16 if "avx512f" in CPU_FEATURES else 8  # floats per vector register
_I1, _I16, _I32, _I64 = ir.IntType(1), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()
_VF = ir.VectorType(_F32, LANES)
# Register blocks that fit the vector registers: AVX-512's 32 hold 4 rows x 4 keys (scores)
# or 4 rows x 4 chunks (values) of accumulators; AVX2's 16 hold half of either, so there a
# score block is two passes of 2 rows and a value pass covers 2 chunks (with all 16 live,
# every FMA went through the stack).
# Each dot product and accumulator keeps its order: the results are the same bits.
ROWS_PER_PASS = 4 if LANES == 16 else 2
CHUNKS_PER_PASS = 4 if LANES == 16 else 2


@njit(cache=True, nogil=True)
def fits(hd: int) -> bool:
    return hd % LANES == 0


class _Array:
    """Element pointers into a numba array argument (its strides, read at run time)."""

    def __init__(self, context, builder, arrty, arr):
        ary = context.make_array(arrty)(context, builder, arr)
        self.builder, self.ndim = builder, arrty.ndim
        self.elem = context.get_data_type(arrty.dtype)
        self.base = builder.ptrtoint(ary.data, _I64)
        self.strides = cgutils.unpack_tuple(builder, ary.strides, arrty.ndim)

    def ptr(self, *index, ty=None):
        b = self.builder
        addr = self.base
        for i, stride in zip(index, self.strides):
            addr = b.add(addr, b.mul(i, stride))
        return b.inttoptr(addr, (ty or self.elem).as_pointer())


def _load_chunk(builder, src: _Array, index, d) -> ir.Value:
    """LANES floats of src[index..., d: d + LANES] (F16 bits are converted)."""
    if src.elem == _I16:
        bits = builder.load(src.ptr(*index, d, ty=ir.VectorType(_I16, LANES)), align=2)
        return half_to_f32(builder, bits)
    return builder.load(src.ptr(*index, d, ty=_VF), align=4)


def _fma(builder, a, b, c):
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_VF, [_VF] * 3), f"llvm.fma.v{LANES}f32")
    return builder.call(fn, [a, b, c])


def _combine(builder, x, y, width: int):
    """x, y hold items of `width` lanes each; returns their items, x's then y's, each summed
    down to width/2 lanes (lane i + lane i + width/2)."""
    lo, hi = [], []
    for base in range(0, 2 * LANES, width):
        lo += list(range(base, base + width // 2))
        hi += list(range(base + width // 2, base + width))
    mask_lo = ir.Constant(ir.VectorType(_I32, LANES), lo)
    mask_hi = ir.Constant(ir.VectorType(_I32, LANES), hi)
    return builder.fadd(builder.shuffle_vector(x, y, mask_lo),
                        builder.shuffle_vector(x, y, mask_hi))


def _reduce(builder, vectors: list) -> list:
    """Horizontal sums of the vectors (one item each), as vectors holding one sum per lane,
    in the vectors' order: a binary tree of _combine."""
    width = LANES
    while width > 1 and len(vectors) > 1:
        vectors = [_combine(builder, vectors[i], vectors[i + 1], width)
                   for i in range(0, len(vectors), 2)]
        width //= 2
    while width > 1:  # fewer items than lanes: finish each vector on its own
        vectors = [_combine(builder, v, v, width) for v in vectors]
        width //= 2
    return vectors


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise TypingError(f"attention blocks: {what}")


def _is(ty, ndim, dtypes) -> bool:
    """An array of that rank and dtype, C-contiguous or (the KV cache, model.KVCache) of any
    layout whose last dimension is contiguous, as the caches are made."""
    return isinstance(ty, types.Array) and ty.ndim == ndim and ty.layout in ("C", "A") and \
        ty.dtype in dtypes


def _prefetch_rows(builder, arr: _Array, s, keys, kvh, row_bytes):
    """Prefetch (read, all levels) every 64-byte line of rows arr[s, key, kvh] for each key;
    prefetches never fault, so rows past the cache's end need no check."""
    fn = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), _I32, _I32, _I32]),
        "llvm.prefetch.p0")
    n_lines = builder.udiv(builder.add(row_bytes, ir.Constant(_I64, 63)), ir.Constant(_I64, 64))
    with cgutils.for_range(builder, n_lines) as line:
        off = builder.mul(line.index, ir.Constant(_I64, 64))
        for key in keys:
            row = builder.ptrtoint(arr.ptr(s, key, kvh, ir.Constant(_I64, 0)), _I64)
            ptr = builder.inttoptr(builder.add(row, off), ir.IntType(8).as_pointer())
            builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3),
                              ir.Constant(_I32, 1)])


@intrinsic
def score_block(typingctx, qt, ra, rb, rc, rd, src, s, j0, kvh, jj, n_keys, sc, col, k_pf,
                v_pf, ahead):
    """sc[r, col + jj + k] = qt[r] . src[s, j0 + jj + k, kvh] for rows r in (ra, rb, rc, rd)
    (repeats allowed) and keys k < n_keys <= 4 (the block is computed for 4 keys, the ones
    past n_keys repeat the last and are not stored). With ahead > 0, the rows `ahead` cells
    further on of the caches k_pf and v_pf ([s, j0 + jj + k + ahead, kvh]) are prefetched."""
    _check(_is(qt, 2, (types.float32,)) and _is(sc, 2, (types.float32,)), "qt/sc")
    _check(_is(src, 4, (types.uint16, types.float32)), "src")
    _check(_is(k_pf, 4, (types.uint16, types.float32)) and
           _is(v_pf, 4, (types.uint16, types.float32)), "k_pf/v_pf")
    ip = types.intp
    sig = types.none(qt, ip, ip, ip, ip, src, ip, ip, ip, ip, ip, sc, ip, k_pf, v_pf, ip)

    def codegen(context, builder, signature, args):
        q = _Array(context, builder, signature.args[0], args[0])
        rows = args[1:5]
        k_src = _Array(context, builder, signature.args[5], args[5])
        s_, j0_, kvh_, jj_, n_, = args[6:11]
        out = _Array(context, builder, signature.args[11], args[11])
        col_ = args[12]
        hd = builder.udiv(q.strides[0], ir.Constant(_I64, 4))
        ahead = args[15]
        with builder.if_then(builder.icmp_signed(">", ahead, ir.Constant(_I64, 0))):
            first = builder.add(builder.add(j0_, jj_), ahead)
            ahead_keys = [builder.add(first, ir.Constant(_I64, k)) for k in range(4)]
            for arg in (13, 14):
                cache = _Array(context, builder, signature.args[arg], args[arg])
                size = context.get_abi_sizeof(cache.elem)
                row_bytes = builder.mul(hd, ir.Constant(_I64, size))
                _prefetch_rows(builder, cache, s_, ahead_keys, kvh_, row_bytes)
        last = builder.sub(n_, ir.Constant(_I64, 1))
        keys = []
        for k in range(4):
            kk = ir.Constant(_I64, k)
            use = builder.select(builder.icmp_signed("<", kk, n_), kk, last)
            keys.append(builder.add(j0_, builder.add(jj_, use)))
        n_chunks = builder.udiv(hd, ir.Constant(_I64, LANES))
        col = builder.add(col_, jj_)

        def pass_(part):
            _score_rows(builder, q, part, k_src, (s_, kvh_), keys, n_chunks, out, col, n_)

        if ROWS_PER_PASS == 4:
            pass_(rows)
        else:  # a repeated last row (3 heads per KV head: SmolLM2) is computed once
            pass_(rows[:2])
            with builder.if_else(builder.icmp_signed("==", rows[2], rows[3])) as (same, other):
                with same:
                    pass_(rows[2:3])
                with other:
                    pass_(rows[2:])
        return context.get_dummy_value()

    return sig, codegen


def _score_rows(builder, q, rows, k_src, at, keys, n_chunks, out, col, n_keys):
    """score_block's dots of `rows` x 4 keys: len(rows) x 4 vector accumulators over the
    head dimension's chunks, one reduction tree, stores masked past n_keys."""
    zero = ir.Constant(_VF, [0.0] * LANES)
    accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(4)] for _ in rows]
    s_, kvh_ = at
    with cgutils.for_range(builder, n_chunks) as loop:
        d = builder.mul(loop.index, ir.Constant(_I64, LANES))
        kv = [_load_chunk(builder, k_src, (s_, key, kvh_), d) for key in keys]
        for r, row in enumerate(rows):
            qv = builder.load(q.ptr(row, d, ty=_VF), align=4)
            for k in range(4):
                acc = accs[r][k]
                builder.store(_fma(builder, qv, kv[k], builder.load(acc)), acc)
    sums = _reduce(builder, [builder.load(accs[r][k]) for r in range(len(rows))
                             for k in range(4)])
    mask_ty = ir.VectorType(_I1, 4)
    store = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(ir.VoidType(), [ir.VectorType(_F32, 4),
                                        ir.VectorType(_F32, 4).as_pointer(), _I32,
                                        mask_ty]),
        "llvm.masked.store.v4f32.p0")
    lanes4 = ir.Constant(ir.VectorType(_I64, 4), [0, 1, 2, 3])
    n_splat = builder.insert_element(ir.Constant(ir.VectorType(_I64, 4), None), n_keys,
                                     ir.Constant(_I32, 0))
    n_splat = builder.shuffle_vector(n_splat, n_splat,
                                     ir.Constant(ir.VectorType(_I32, 4), [0] * 4))
    mask = builder.icmp_signed("<", lanes4, n_splat)
    per_vec = LANES // 4  # rows per reduced vector
    for r, row in enumerate(rows):
        v = sums[r // per_vec]
        base = (r % per_vec) * 4
        four = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 4),
                                                        list(range(base, base + 4))))
        ptr = out.ptr(row, col, ty=ir.VectorType(_F32, 4))
        builder.call(store, [four, ptr, ir.Constant(_I32, 4), mask])


def _round_f16(builder, v):
    return half_to_f32(builder, f32_to_half(builder, v))


def _value_codegen(f16_acc: bool):
    """value_block (f16_acc False) or value_block_f16's code generator."""

    def codegen(context, builder, signature, args):
        out = _Array(context, builder, signature.args[0], args[0])
        rows, prow = args[1:5], args[5:9]
        p = _Array(context, builder, signature.args[9], args[9])
        col_ = args[10]
        v_src = _Array(context, builder, signature.args[11], args[11])
        s_, j0_, kvh_, a_, b_ = args[12:17]
        scale = _Array(context, builder, signature.args[17], args[17]) if f16_acc else None
        hd = builder.udiv(out.strides[0], ir.Constant(_I64, 4))
        n_chunks = builder.udiv(hd, ir.Constant(_I64, LANES))
        group = ir.Constant(_I64, CHUNKS_PER_PASS)  # 4 rows x this many chunks in registers
        n_pass = builder.udiv(builder.add(n_chunks, ir.Constant(_I64, CHUNKS_PER_PASS - 1)),
                              group)
        one = ir.Constant(_F32, 1.0)
        with cgutils.for_range(builder, n_pass) as pass_:
            c0 = builder.mul(pass_.index, group)
            width = builder.sub(n_chunks, c0)
            # a pass covers CHUNKS_PER_PASS chunks; a last pass of fewer repeats its last
            # chunk (recomputed from the same stored start, stored again identically)
            chunks = []
            for c in range(CHUNKS_PER_PASS):
                cc = ir.Constant(_I64, c)
                use = builder.select(builder.icmp_signed("<", cc, width), cc,
                                     builder.sub(width, ir.Constant(_I64, 1)))
                chunks.append(builder.mul(builder.add(c0, use), ir.Constant(_I64, LANES)))
            accs = [[cgutils.alloca_once(builder, _VF) for _ in chunks] for _ in range(4)]
            for r, row in enumerate(rows):
                for c, d in enumerate(chunks):
                    builder.store(builder.load(out.ptr(row, d, ty=_VF), align=4), accs[r][c])
            with cgutils.for_range_slice(builder, a_, b_, ir.Constant(_I64, 1)) as (jj, _):
                key = builder.add(j0_, jj)
                vv = [_load_chunk(builder, v_src, (s_, key, kvh_), d) for d in chunks]
                at = builder.add(col_, jj)
                for r, pr in enumerate(prow):
                    if f16_acc:  # a new running maximum: the accumulator is rescaled first
                        ms = builder.load(scale.ptr(pr, at, ty=_F32), align=4)
                        with builder.if_then(builder.fcmp_ordered("!=", ms, one),
                                             likely=False):
                            msv = _splat(builder, ms)
                            for c in range(len(chunks)):
                                scaled = builder.fmul(builder.load(accs[r][c]), msv)
                                builder.store(_round_f16(builder, scaled), accs[r][c])
                    w = builder.load(p.ptr(pr, at, ty=_F32), align=4)
                    ws = _splat(builder, w)
                    for c in range(len(chunks)):
                        new = _fma(builder, ws, vv[c], builder.load(accs[r][c]))
                        if f16_acc:
                            new = _round_f16(builder, new)
                        builder.store(new, accs[r][c])
            for r, row in enumerate(rows):
                for c, d in enumerate(chunks):
                    builder.store(builder.load(accs[r][c]), out.ptr(row, d, ty=_VF), align=4)
        return context.get_dummy_value()

    return codegen


def _splat(builder, x):
    v = builder.insert_element(ir.Constant(_VF, None), x, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))


def _value_sig(acc, sc, src):
    _check(_is(acc, 2, (types.float32,)) and _is(sc, 2, (types.float32,)), "acc/sc")
    _check(_is(src, 4, (types.uint16, types.float32)), "src")
    ip = types.intp
    return (acc, ip, ip, ip, ip, ip, ip, ip, ip, sc, ip, src, ip, ip, ip, ip, ip)


@intrinsic
def value_block(typingctx, acc, ra, rb, rc, rd, pa, pb, pc, pd, sc, col, src, s, j0, kvh, a,
                b):
    """acc[ra] += sum over jj in [a, b), in order, of sc[pa, col + jj] * src[s, j0 + jj, kvh]
    (fused multiply-adds), likewise (rb, pb), (rc, pc), (rd, pd). The acc rows must be
    distinct (a spare row takes the place of a missing one), the P rows need not be."""
    return types.none(*_value_sig(acc, sc, src)), _value_codegen(False)


@intrinsic
def value_block_f16(typingctx, acc, ra, rb, rc, rd, pa, pb, pc, pd, sc, col, src, s, j0, kvh,
                    a, b, rs):
    """value_block with F16 accumulators, key by key in order: acc[ra] = F16(acc[ra] *
    rs[pa, col + jj]) when that factor is not 1, then acc[ra] = F16(acc[ra] + sc[pa, col +
    jj] * V) (ggml_vec_scale_f16 and ggml_vec_mad_f16); likewise the other rows."""
    _check(_is(rs, 2, (types.float32,)), "rs")
    return types.none(*_value_sig(acc, sc, src), rs), _value_codegen(True)
