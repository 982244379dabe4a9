"""Dynamic scheduling of a parallel loop's chunks: each thread takes the next chunk when it
is done with its last one.

A Numba `prange` (OpenMP layer) splits its range statically, one contiguous share per thread,
so the thread that ends first waits at the barrier for the other. On the development machine
(2 vCPUs of a shared Intel Xeon) the second core ran the same matmul share ~13% slower, and the
calling thread spent 12% of an 8-sequence decode step spinning at the end of the matmuls
(perf, cpu-clock samples). Taking chunks from a shared counter instead:

    counter = chunk_counter()
    for _ in prange(n_workers()):
        c = next_chunk(counter)
        while c < n_chunks:
            ...chunk c...
            c = next_chunk(counter)

The counter lives in the calling function's stack frame, which outlives the parallel region,
so nothing is allocated per call; its address reaches the threads as a plain integer.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.ufunc.parallel import _iget_num_threads

_I64 = ir.IntType(64)


@intrinsic
def chunk_counter(typingctx):
    """The address of a new zeroed int64 in the caller's stack frame."""

    def codegen(context, builder, signature, args):
        slot = cgutils.alloca_once(builder, _I64)
        builder.store(_I64(0), slot)
        return builder.ptrtoint(slot, _I64)

    return types.int64(), codegen


@intrinsic
def next_chunk(typingctx, counter):
    """Atomically take the counter's value and add 1 to it: the next chunk to run."""
    if counter != types.int64:
        return None

    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], _I64.as_pointer())
        return builder.atomic_rmw("add", ptr, _I64(1), "monotonic")

    return types.int64(types.int64), codegen


@njit(cache=True, nogil=True)
def n_workers(n_chunks):
    """Parallel tasks for n_chunks chunks: one per thread, never more than chunks.
    (numba.get_num_threads() goes through a ctypes pointer, which stops caching; its
    intrinsic calls the same C function by name.)"""
    return max(1, min(_iget_num_threads(), n_chunks))
