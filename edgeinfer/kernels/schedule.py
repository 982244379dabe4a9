"""Parallel loops over chunks: each thread runs its own contiguous share, then helps with the
others' from their far ends.

A Numba `prange` (OpenMP layer) splits its range statically, one contiguous share per thread,
so the thread that ends first waits at the barrier for the other, and on shared VMs the cores
do not run at the same speed. Handing out every chunk from one shared counter fixes the wait
but interleaves the threads' rows, which slows the memory-bound single-token matmuls (each
thread's stream of weight rows, and the prefetches ahead of it, jumps at every chunk; figures
in docs/performance.md, Kernels). So:

    counters, n_seg = chunk_counters(), n_workers(n_chunks)
    for task in prange(n_seg):
        c, k = next_chunk(counters, np.int64(task), np.int64(0), n_chunks, n_seg)
        while c >= 0:
            ...chunk c...
            c, k = next_chunk(counters, np.int64(task), k, n_chunks, n_seg)

A segment's owner takes its chunks from the front, helpers from the back; one atomic word per
segment counts both (front in the low half, back in the high half), so a chunk is never taken
twice. The counters live in the calling function's stack frame, which outlives the parallel
region: nothing is allocated per call, and their address reaches the threads as an integer.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.ufunc.parallel import _iget_num_threads

_I8, _I64 = ir.IntType(8), ir.IntType(64)
MAX_SEGMENTS = 64  # segments (threads that share a loop); more threads leave the rest idle
_LINE = 64  # bytes between counters: one cache line each
_BACK = 1 << 32  # one chunk taken from a segment's back
_HALF = _BACK - 1


@intrinsic
def chunk_counters(typingctx):
    """The address of MAX_SEGMENTS zeroed counters, a cache line apart, in the caller's
    stack frame."""

    def codegen(context, builder, signature, args):
        size = MAX_SEGMENTS * _LINE
        block = cgutils.alloca_once(builder, ir.ArrayType(_I8, size))
        block.align = _LINE
        ptr = builder.bitcast(block, _I8.as_pointer())
        cgutils.memset(builder, ptr, ir.Constant(_I64, size), 0)
        return builder.ptrtoint(ptr, _I64)

    return types.int64(), codegen


@intrinsic
def _fetch_add(typingctx, addr, value):
    """Atomically add value to the int64 at addr; returns the value before."""
    if addr != types.int64 or value != types.int64:
        return None

    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], _I64.as_pointer())
        return builder.atomic_rmw("add", ptr, args[1], "monotonic")

    return types.int64(types.int64, types.int64), codegen


@njit(cache=True, nogil=True)
def n_workers(n_chunks):
    """Tasks (segments) for n_chunks chunks: one per thread, never more than chunks.
    (numba.get_num_threads() goes through a ctypes pointer, which stops caching; its
    intrinsic calls the same C function by name.)"""
    return max(1, min(_iget_num_threads(), n_chunks, MAX_SEGMENTS))


@njit(cache=True, nogil=True)
def take(counters, seg, from_back, n_chunks, n_seg):
    """The next chunk of segment seg (of n_seg splitting n_chunks): its owner takes from the
    front, helpers (from_back) from the back; -1 once the segment is done."""
    start, stop = seg * n_chunks // n_seg, (seg + 1) * n_chunks // n_seg
    old = _fetch_add(counters + seg * _LINE, _BACK if from_back else 1)
    front, back = old & _HALF, old >> 32
    if front + back >= stop - start:
        return -1
    return stop - 1 - back if from_back else start + front


@njit(cache=True, nogil=True)
def next_chunk(counters, task, k, n_chunks, n_seg):
    """(chunk, k): the next chunk for task, from its own segment while it lasts, then from the
    others' in turn (k: how far round it has got, 0 at first); chunk -1 when all are done.
    Pass np.int64 values: a literal 0 would compile a second version."""
    while k < n_seg:
        c = take(counters, (task + k) % n_seg, k > 0, n_chunks, n_seg)
        if c >= 0:
            return c, k
        k += 1
    return np.int64(-1), k
