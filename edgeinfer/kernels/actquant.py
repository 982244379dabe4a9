"""Activation formats: float32 activations converted once per matmul into the weight type's
llama.cpp `vec_dot_type` (architectures.md §1.4).

| format | what the quantizer writes                                                       |
|--------|---------------------------------------------------------------------------------|
| f32    | xf = x                                                                          |
| f16    | xf = f16(x) widened back to f32 (round to nearest even, F16C `vcvtps2ph`)       |
| bf16   | xf = bf16(x) widened back to f32 (ggml_compute_fp32_to_bf16: RNE, quiet NaN)    |
| q8_0   | per 32 values: xd = f16(amax/127), xq = rint(x * (127/amax)), ties to even      |
| q8_1   | q8_0 plus xs = f16(d * sum(xq)) with d the unrounded f32 amax/127               |

With AVX-512 VNNI (both formats) and AVX2 (q8_1, and q8_0_grouped: the output head's format
there), xq's whole runs of 8 blocks are stored in the order the legacy kernels' 8-block step
multiplies them, and grouped q8_0's xs holds their lane sums (GROUP, below).

The rounding mirrors ggml's x86 `quantize_row_q8_0/q8_1` (ggml-cpu/arch/x86/quants.c), which
multiplies by the f32 reciprocal 127/amax and rounds with `_mm256_round_ps(NEAREST)`; the
scalar reference `quantize_row_q8_0_ref` would instead round ties away from zero.
Scales kept as F16 in llama.cpp are stored here already rounded to F16, as f32 values, so a
kernel reads them without converting.

No numba.config switch is set anywhere: the integer kernels in legacy.py emit explicit LLVM
vector IR and do not depend on the (off by default) SLP vectorizer. F16 rounding is f16.py's
(hardware where the CPU has it, integer code otherwise).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from edgeinfer.kernels.f16 import round_f16
from edgeinfer.kernels.registry import ActFormat
from edgeinfer.kernels.target import AVX512_VNNI, DOT_PATH

QK8 = 32  # values per Q8_0 / Q8_1 block

# Grouped layout of xq (AVX2 and AVX-512 VNNI hosts): each run of GROUP = 8 whole blocks is stored
# as the four 64-byte registers the legacy kernels' 8-block step multiplies, so that it loads them
# as they are. Register k, 32-bit lane l holds value dword GROUP_DWORDS[k][l // 8] (values 4m..4m+3)
# of block l % 8: the dwords a nibble format's low (k < 2) or high nibbles give, two registers from
# the same 32 bytes of 8 blocks (legacy_blocks' oct decoders). AVX2 reads each as two 32-byte
# registers,
# lane l of each holding block l. Blocks past the last whole group keep the natural order (on AVX2,
# pairs of them: PAIRS). `natural_order` undoes it. Grouped Q8_0 activations also carry, per group,
# minus the sum of each of its SUM_LANES register lanes (int32 in xs's bits): the weights' bias
# correction (legacy: u = value + bias, so dot = sum(u * x) - bias * sum(x)), taken once per input
# instead of once per tile of rows; on AVX2 lane l's sum is block l's. On AVX2 the layers' Q8_0
# activations stay in natural order: Q8_0, Q4_0 and Q5_0 keep llama.cpp's own block-by-block order
# there, and so its exact results (isa.avx2.YMM_STEPS); only their output-head kernels take the
# 8-block step.
GROUP = 8 if AVX512_VNNI or DOT_PATH == "avx2" else 0
# AVX2: the blocks past the last whole group, two at a time, in pair order (legacy's pair
# step): the second 16 bytes of block A swapped with the first 16 of block B, so that a
# 32-byte register holds values 0..15 (then 16..31) of both. An odd last block stays as it is.
PAIRS = DOT_PATH == "avx2" and GROUP != 0
# activation formats stored grouped
GROUPED = {"q8_0": AVX512_VNNI, "q8_0_grouped": GROUP != 0, "q8_1": GROUP != 0}
SUM_LANES = 16 if AVX512_VNNI else 8  # 32-bit lanes of the 8-block step's registers
GROUP_SUMS = GROUP * QK8 // SUM_LANES if GROUP else 0  # values per xs entry of grouped Q8_0
_Q8_0_GROUPED = GROUPED["q8_0"]  # numba reads bools, not dicts, as compile-time constants
GROUP_DWORDS = ((0, 2), (1, 3), (4, 6), (5, 7))
# source dword (8 * block + value dword) of each of a group's 64 dwords
_GROUP_SOURCE = [
    8 * (lane % 8) + GROUP_DWORDS[k][lane // 8] for k in range(4) for lane in range(16)
]


@intrinsic
def _f32_bits(typingctx, x):
    """Bit pattern of a float32 as uint32."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _bits_f32(typingctx, u):
    """float32 with the given uint32 bit pattern."""
    if u != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@njit(cache=True, nogil=True)
def _round_bf16(x: np.float32) -> np.float32:
    """ggml_compute_fp32_to_bf16, widened back to f32."""
    u = np.int64(_f32_bits(x))
    if (u & 0x7FFFFFFF) > 0x7F800000:  # NaN: keep it, force the quiet bit
        bits = ((u >> 16) | 64) << 16
    else:  # round to nearest even on the 16 dropped bits
        bits = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) << 16
    return _bits_f32(np.uint32(bits & 0xFFFFFFFF))


def _is_row(ty, dtype) -> bool:
    return isinstance(ty, types.Array) and ty.ndim == 1 and ty.layout == "C" and ty.dtype == dtype


def _block_ptr(context, builder, arrty, arr, i0, elem: ir.Type, n: int):
    """Pointer to <n x elem> at element i0 of a contiguous 1-D array."""
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [i0]), ir.VectorType(elem, n).as_pointer())


def _reduce(builder, op: str, vec):
    name = f"llvm.vector.reduce.{op}.v{vec.type.count}i32"
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vec.type.element, [vec.type]), name
    )
    return builder.call(fn, [vec])


@intrinsic
def _block_amax(typingctx, x, i0):
    """max |x[i0:i0+32]|: an unsigned max over the sign-cleared bit patterns (monotonic for
    non-negative floats), so it vectorizes without fast-math."""
    if not _is_row(x, types.float32) or not isinstance(i0, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ptr = _block_ptr(context, builder, signature.args[0], args[0], args[1], ir.FloatType(), QK8)
        bits = builder.bitcast(builder.load(ptr, align=4), ir.VectorType(ir.IntType(32), QK8))
        mags = builder.and_(bits, ir.Constant(bits.type, [0x7FFFFFFF] * QK8))
        return builder.bitcast(_reduce(builder, "umax", mags), ir.FloatType())

    return types.float32(x, i0), codegen


@intrinsic
def _block_quantize(typingctx, x, xq, i0, inv):
    """xq[i0:i0+32] = rint(x * inv) (ties to even, like _mm256_round_ps); returns sum(q)."""
    if not (_is_row(x, types.float32) and _is_row(xq, types.int8)) or inv != types.float32:
        return None

    def codegen(context, builder, signature, args):
        xty, qty = signature.args[0], signature.args[1]
        vf, vi = ir.VectorType(ir.FloatType(), QK8), ir.VectorType(ir.IntType(32), QK8)
        xs = builder.load(_block_ptr(context, builder, xty, args[0], args[2], vf.element, QK8))
        scale = builder.insert_element(ir.Constant(vf, None), args[3], ir.IntType(32)(0))
        scale = builder.shuffle_vector(scale, scale, ir.Constant(vi, [0] * QK8))
        rint = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vf, [vf]), "llvm.rint.v32f32"
        )
        q = builder.fptosi(builder.call(rint, [builder.fmul(xs, scale)]), vi)
        q_ptr = _block_ptr(context, builder, qty, args[1], args[2], ir.IntType(8), QK8)
        builder.store(builder.trunc(q, ir.VectorType(ir.IntType(8), QK8)), q_ptr, align=1)
        return _reduce(builder, "add", q)

    return types.int32(x, xq, i0, inv), codegen


@intrinsic
def _regroup(typingctx, xq, i0):
    """xq[i0:i0+256] (8 quantized blocks) into the grouped order, in place."""
    if not _is_row(xq, types.int8) or not isinstance(i0, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v64 = ir.VectorType(ir.IntType(32), 64)
        ptr = builder.bitcast(
            _block_ptr(context, builder, signature.args[0], args[0], args[1], ir.IntType(8), 1),
            v64.as_pointer(),
        )
        dwords = builder.load(ptr, align=1)
        order = ir.Constant(ir.VectorType(ir.IntType(32), 64), _GROUP_SOURCE)
        builder.store(builder.shuffle_vector(dwords, dwords, order), ptr, align=1)
        return context.get_dummy_value()

    return types.none(xq, i0), codegen


def natural_order(xq: np.ndarray, fmt_name: str) -> np.ndarray:
    """A copy of (n_tok, n_in) quantized activations of format fmt_name in natural order."""
    n_tok, n_in = xq.shape
    if not GROUPED.get(fmt_name, False):
        return xq.copy()
    n_grouped = n_in // (GROUP * QK8) * GROUP * QK8
    out = xq.copy()
    stored = xq[:, :n_grouped].view(np.int32).reshape(n_tok, -1, 64)
    natural = np.empty_like(stored)
    natural[:, :, _GROUP_SOURCE] = stored
    out[:, :n_grouped] = natural.reshape(n_tok, -1).view(np.int8)
    if PAIRS:  # the pair swap is its own inverse
        for t in range(n_tok):
            _pair_blocks(out[t])
    return out


@njit(cache=True, nogil=True)
def _group_blocks(xq) -> None:
    """Every whole group of a quantized row into the grouped order (see GROUP), and on AVX2
    the blocks after them into pair order (PAIRS)."""
    if GROUP:
        for i0 in range(0, xq.shape[0] - GROUP * QK8 + 1, GROUP * QK8):
            _regroup(xq, i0)
    if PAIRS:
        _pair_blocks(xq)


@njit(cache=True, nogil=True)
def _pair_blocks(xq) -> None:
    """Blocks past the last whole group, two at a time: A's bytes 16..31 swapped with B's
    0..15 (PAIRS)."""
    start = xq.shape[0] // (GROUP * QK8) * GROUP * QK8
    for a in range(start, xq.shape[0] - 2 * QK8 + 1, 2 * QK8):
        for k in range(16):
            xq[a + 16 + k], xq[a + QK8 + k] = xq[a + QK8 + k], xq[a + 16 + k]


@njit(cache=True, nogil=True)
def _group_sums(xq, sums) -> None:
    """sums[SUM_LANES * g + lane] = minus lane `lane`'s sum over group g's registers (dwords
    lane, lane + SUM_LANES, ... of the group)."""
    for g in range(xq.shape[0] // (GROUP * QK8)):
        for lane in range(SUM_LANES):
            total = 0
            for k in range(GROUP * QK8 // 4 // SUM_LANES):
                at = GROUP * QK8 * g + 4 * (SUM_LANES * k + lane)
                total += np.int32(xq[at]) + xq[at + 1] + xq[at + 2] + xq[at + 3]
            sums[SUM_LANES * g + lane] = -total


@njit(cache=True, nogil=True)
def _quantize_block_q8(x, i0, xq):
    """Quantize x[i0:i0+32] into xq; returns (d unrounded f32, sum of the quants)."""
    amax = _block_amax(x, i0)
    d = amax / np.float32(127.0)
    inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
    return d, _block_quantize(x, xq, i0, inv)


@njit(cache=True, nogil=True)
def quantize_f32(x, xq, xd, xs, xf) -> None:
    """xf = x (F32 weights use F32 activations unchanged)."""
    n_tok, n_in = x.shape
    for t in range(n_tok):
        for i in range(n_in):
            xf[t, i] = x[t, i]


@njit(cache=True, nogil=True)
def quantize_f16(x, xq, xd, xs, xf) -> None:
    """xf = f16(x), as llama.cpp rounds activations for F16 weights."""
    n_tok, n_in = x.shape
    for t in range(n_tok):
        for i in range(n_in):
            xf[t, i] = round_f16(np.float32(x[t, i]))


@njit(cache=True, nogil=True)
def quantize_bf16(x, xq, xd, xs, xf) -> None:
    """xf = bf16(x), as llama.cpp rounds activations for BF16 weights."""
    n_tok, n_in = x.shape
    for t in range(n_tok):
        for i in range(n_in):
            xf[t, i] = _round_bf16(np.float32(x[t, i]))


@njit(cache=True, nogil=True)
def _quantize_q8_0(x, xq, xd, xs, grouped) -> None:
    n_tok, n_in = x.shape
    for t in range(n_tok):
        for b in range(n_in // QK8):
            d, _ = _quantize_block_q8(x[t], b * QK8, xq[t])
            xd[t, b] = round_f16(d)
        if grouped:
            _group_blocks(xq[t])
            _group_sums(xq[t], xs[t].view(np.int32))


@njit(cache=True, nogil=True)
def quantize_q8_0(x, xq, xd, xs, xf) -> None:
    """Q8_0 activations: xq int8, xd = per-block scale rounded to f16 (and where grouped, the
    groups' lane sums in xs)."""
    _quantize_q8_0(x, xq, xd, xs, _Q8_0_GROUPED)


@njit(cache=True, nogil=True)
def quantize_q8_0_grouped(x, xq, xd, xs, xf) -> None:
    """Q8_0 activations in the grouped order, with their lane sums (where GROUP)."""
    _quantize_q8_0(x, xq, xd, xs, GROUP != 0)


@njit(cache=True, nogil=True)
def quantize_q8_1(x, xq, xd, xs, xf) -> None:
    """Q8_1 activations: Q8_0 plus xs = f16(d * sum(q)) per block (d not yet rounded)."""
    n_tok, n_in = x.shape
    for t in range(n_tok):
        for b in range(n_in // QK8):
            d, qsum = _quantize_block_q8(x[t], b * QK8, xq[t])
            xd[t, b] = round_f16(d)
            xs[t, b] = round_f16(d * np.float32(qsum))
        _group_blocks(xq[t])


F32_ACT = ActFormat("f32", 1, 0, quantize_f32)
F16_ACT = ActFormat("f16", 1, 0, quantize_f16)
BF16_ACT = ActFormat("bf16", 1, 0, quantize_bf16)
Q8_0_ACT = ActFormat("q8_0", QK8, GROUP_SUMS if GROUPED["q8_0"] else 0, quantize_q8_0)
Q8_0_GROUPED_ACT = ActFormat("q8_0_grouped", QK8, GROUP_SUMS, quantize_q8_0_grouped)
Q8_1_ACT = ActFormat("q8_1", QK8, QK8, quantize_q8_1)
