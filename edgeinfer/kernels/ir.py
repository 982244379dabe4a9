"""LLVM IR helpers shared by the kernels that emit vector IR (legacy.py, legacy_blocks.py,
kquants.py and the ISA steps in isa/): vector types, constants, shuffles, unaligned loads,
calls of intrinsics, lane sums, branch-and-phi selection, optimizer barriers, prefetches and
array-argument access."""

from __future__ import annotations

from contextlib import contextmanager

from llvmlite import ir
from numba.core import cgutils

from edgeinfer.kernels.f16 import half_to_f32
from edgeinfer.kernels.target import WEIGHT_PREFETCH_LOCALITY

_I8, _I16, _I32, _I64 = (ir.IntType(n) for n in (8, 16, 32, 64))
_F32 = ir.FloatType()


def vec(elem: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(elem, n)


def splat(elem: ir.Type, n: int, value) -> ir.Constant:
    """A constant vector of n copies of value."""
    return ir.Constant(vec(elem, n), [value] * n)


def splat_value(builder, value, n: int):
    """A runtime scalar in all n lanes."""
    v = builder.insert_element(ir.Constant(vec(value.type, n), None), value, _I32(0))
    return shuffle(builder, v, v, [0] * n)


def shuffle(builder, a, b, idx: list[int]):
    """Lanes idx of a and b end to end (a's lanes first)."""
    return builder.shuffle_vector(a, b, ir.Constant(vec(_I32, len(idx)), idx))


def permute(builder, v, idx: list[int]):
    """Lanes idx of one vector."""
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                  ir.Constant(vec(_I32, len(idx)), idx))


def concat(builder, parts):
    """Equal-width vectors end to end."""
    while len(parts) > 1:
        n = parts[0].type.count
        pairs = zip(parts[::2], parts[1::2])
        parts = [shuffle(builder, a, b, list(range(2 * n))) for a, b in pairs]
    return parts[0]


def from_scalars(builder, values):
    """A vector of the scalars, in order."""
    v = ir.Constant(vec(values[0].type, len(values)), ir.Undefined)
    for k, value in enumerate(values):
        v = builder.insert_element(v, value, _I32(k))
    return v


def load(builder, base, offset, ty: ir.Type):
    """Unaligned load of `ty` at byte `offset` (i64 value or int) from an i8* `base`."""
    offset = offset if isinstance(offset, ir.Value) else ir.Constant(_I64, offset)
    ptr = builder.bitcast(builder.gep(base, [offset]), ty.as_pointer())
    return builder.load(ptr, align=1)


def load_f16(builder, base, offset):
    """The f16 at byte `offset` of `base`, as f32."""
    return half_to_f32(builder, load(builder, base, offset, _I16))


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


def tree_sum(builder, v):
    """The sum of a float vector's lanes: lane j plus lane j + half, halves down to one."""
    while v.type.count > 1:
        half = v.type.count // 2
        v = builder.fadd(permute(builder, v, list(range(half))),
                         permute(builder, v, list(range(half, 2 * half))))
    return builder.extract_element(v, _I32(0))


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


@contextmanager
def loop_or_once(builder, count, once: bool):
    """A loop over range(count), or where count is known to be 0 or 1 (once), a branch
    instead: as loops, a tile's accumulator phis cost about 70 register moves."""
    if not once:
        with cgutils.for_range(builder, count) as loop:
            yield loop.index
        return
    with builder.if_then(builder.icmp_unsigned("!=", count, _I64(0))):
        yield _I64(0)


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


def prefetch(builder, ptr, locality: int = WEIGHT_PREFETCH_LOCALITY) -> None:
    """Software prefetch of weights for reading, into the cache level of llvm.prefetch's
    `locality` (3: L1). Small blocks carry few bytes per instruction, so the out-of-order
    window alone keeps too few cache misses in flight."""
    fn = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(ir.VoidType(), [ptr.type, _I32, _I32, _I32]),
        "llvm.prefetch.p0",
    )
    builder.call(fn, [ptr, _I32(0), _I32(locality), _I32(1)])


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

    def block(self, row, blk, block_bytes: int):
        """i8* to the blk-th block of `block_bytes` bytes in row `row`."""
        b = self.builder
        offset = b.add(b.mul(row, self.stride), b.mul(blk, ir.Constant(blk.type, block_bytes)))
        return b.gep(self.base, [offset])


def repeat_lanes(builder, values, n: int):
    """[v0 x n, v1 x n, ...] from scalar f32 values."""
    v = ir.Constant(vec(_F32, len(values)), None)
    for k, value in enumerate(values):
        v = builder.insert_element(v, value, _I32(k))
    return shuffle(builder, v, v, [k for k in range(len(values)) for _ in range(n)])
