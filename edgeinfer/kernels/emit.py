"""LLVM IR helpers of the legacy kernels' emitters (legacy.py): calls of intrinsics, lane
sums, branch-and-phi selection, optimizer barriers, prefetches and array-argument access."""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from edgeinfer.kernels.legacy_blocks import shuffle, vec
from edgeinfer.kernels.target import WEIGHT_PREFETCH_LOCALITY

_I8, _I32 = ir.IntType(8), ir.IntType(32)
_F32 = ir.FloatType()


def call(builder, name: str, ret: ir.Type, *args):
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ret, [a.type for a in args]), name
    )
    return builder.call(fn, args)


def fma(builder, a, b, c):
    """a * b + c, lane-wise, one rounding."""
    return call(builder, f"llvm.fma.v{a.type.count}f32", a.type, a, b, c)


def hsums(builder, vecs):
    """Horizontal sums of equal-width <2^k x float> vectors (a tile's accumulators), each in
    one order: lane j plus lane j + half, halves down to one lane (hsum_float_8's order on 8
    lanes). All vectors at once: two of them, each holding segments of w partial sums, become
    one with twice the segments of w/2 (two shuffles and one add for a whole vector of lanes,
    where reducing each vector alone costs about three operations per halving). Returns the
    sums as vectors: their lanes, in turn, hold the inputs' sums in the inputs' order (a last
    odd vector's lanes past the inputs are zeros). Every sum has the same order wherever its
    vector stands in the list."""
    lanes = vecs[0].type.count
    zero = ir.Constant(vecs[0].type, [0.0] * lanes)
    segs, width = 1, lanes
    while width > 1:
        half = width // 2
        firsts = [s * width + k for s in range(segs) for k in range(half)]
        if len(vecs) > 1:
            pairs = zip(vecs[::2], vecs[1::2] if len(vecs) % 2 == 0 else vecs[1::2] + [zero])
            vecs = [
                builder.fadd(
                    shuffle(builder, a, b, firsts + [lanes + i for i in firsts]),
                    shuffle(builder, a, b, [i + half for i in firsts]
                             + [lanes + i + half for i in firsts]),
                )
                for a, b in pairs
            ]
            segs *= 2
        else:  # one vector left: halve its length
            v = vecs[0]
            vecs = [builder.fadd(shuffle(builder, v, v, firsts),
                                 shuffle(builder, v, v, [i + half for i in firsts]))]
        width = half
    return vecs


def lanes_of(builder, vecs, first: int, n: int):
    """Lanes first .. first + n - 1 of the vectors' lanes taken in turn, as one <n x float>
    (n = 1: the float), all from one vector."""
    size = vecs[0].type.count
    v, at = vecs[first // size], first % size
    assert at + n <= size, "lanes_of: the lanes straddle two vectors"
    if n == 1:
        return builder.extract_element(v, _I32(at))
    return shuffle(builder, v, v, list(range(at, at + n)))


def select_by(builder, cases):
    """The values (a list) of the first of `cases` (condition, emit) whose condition holds
    (the last one's is None: otherwise), each emitted in a branch of its own and joined by
    phis."""
    (cond, emit), rest = cases[0], cases[1:]
    if cond is None:
        return emit()
    with builder.if_else(cond) as (then, otherwise):
        with then:
            first = emit(), builder.block
        with otherwise:
            other = select_by(builder, rest), builder.block
    joined = []
    for k, v in enumerate(first[0]):
        phi = builder.phi(v.type)
        for values, block in (first, other):
            phi.add_incoming(values[k], block)
        joined.append(phi)
    return joined


def opaque(builder, value, constraint="=r,0"):
    """value, unknown to LLVM's optimizer (an empty inline asm), e.g. so that loads at
    addresses made from it are not merged with the same loads elsewhere."""
    asm = ir.InlineAsm(ir.FunctionType(value.type, [value.type]), "", constraint)
    return builder.call(asm, [value])


def fence(builder, values, reg: str = "x"):
    """values, all passed through one empty inline asm: the instructions that use its
    results cannot be scheduled before every one of its inputs is computed. A scheduling
    barrier between the steps of an unrolled loop whose steps LLVM would otherwise
    interleave (and so keep more registers live than there are)."""
    n = len(values)
    if n == 1:
        return [opaque(builder, values[0], f"={reg},0")]
    ret = ir.LiteralStructType([v.type for v in values])
    constraint = ",".join([f"={reg}"] * n + [str(k) for k in range(n)])
    asm = ir.InlineAsm(ir.FunctionType(ret, [v.type for v in values]), "", constraint)
    out = builder.call(asm, values)
    return [builder.extract_value(out, k) for k in range(n)]


def prefetch(builder, ptr) -> None:
    """Software prefetch of weights (read, into the cache level of the CPU's
    WEIGHT_PREFETCH_LOCALITY). Small blocks carry few bytes per instruction, so the
    out-of-order window alone keeps too few cache misses in flight; on the development
    machine the Q4 kernels read DRAM at half the rate of Q8_0 without it."""
    fn = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(ir.VoidType(), [ptr.type, _I32, _I32, _I32]),
        "llvm.prefetch.p0",
    )
    builder.call(fn, [ptr, _I32(0), _I32(WEIGHT_PREFETCH_LOCALITY), _I32(1)])


class Array2D:
    """i8* to row i of a C-contiguous 2-D array argument (any row stride)."""

    def __init__(self, context, builder, arrty, arr):
        ary = context.make_array(arrty)(context, builder, arr)
        self.builder = builder
        self.base = builder.bitcast(ary.data, _I8.as_pointer())
        self.stride = cgutils.unpack_tuple(builder, ary.strides, 2)[0]
        self.n_cols = cgutils.unpack_tuple(builder, ary.shape, 2)[1]

    def row(self, i):
        return self.builder.gep(self.base, [self.builder.mul(i, self.stride)])


def repeat_lanes(builder, values, n: int):
    """[v0 x n, v1 x n, ...] from scalar f32 values."""
    v = ir.Constant(vec(_F32, len(values)), None)
    for k, value in enumerate(values):
        v = builder.insert_element(v, value, _I32(k))
    return shuffle(builder, v, v, [k for k in range(len(values)) for _ in range(n)])
