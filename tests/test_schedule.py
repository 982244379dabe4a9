"""Chunked parallel loops (kernels/schedule.py): every chunk runs exactly once, whatever the
thread count and chunk costs (which share a thread runs first is speed, for the benchmarks)."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import njit, prange

from edgeinfer.kernels.schedule import MAX_SEGMENTS, chunk_counters, n_workers, next_chunk


@njit(parallel=True, nogil=True)
def _run_chunks(n_chunks, runs, first, spin):
    """runs[c] counts chunk c's runs; first[task] is the first chunk task ran; chunk c spins
    spin[c] rounds (uneven costs make threads help each other). Returns the segments (tasks)
    the chunks were split into."""
    counters, n_seg = chunk_counters(), n_workers(n_chunks)
    for task in prange(n_seg):
        c, k = next_chunk(counters, np.int64(task), np.int64(0), n_chunks, n_seg)
        while c >= 0:
            if first[task] < 0:
                first[task] = c
            runs[c] += 1
            x = 0.0
            for i in range(spin[c]):
                x += np.sqrt(np.float64(i))
            runs[c] += 0 if x >= 0 else 1
            c, k = next_chunk(counters, np.int64(task), k, n_chunks, n_seg)
    return n_seg


TWO_THREADS = pytest.param(2, marks=pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                                       reason="the split needs 2 threads"))


@pytest.mark.parametrize("threads", [1, TWO_THREADS])
@pytest.mark.parametrize("n_chunks", [0, 1, 3, 257])
@pytest.mark.parametrize("skew", ["even", "front-heavy", "back-heavy"])
def test_every_chunk_runs_exactly_once(threads, n_chunks, skew):
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        spin = np.full(n_chunks, 2000, np.int64)
        if skew == "front-heavy":
            spin[: n_chunks // 2] *= 20
        elif skew == "back-heavy":
            spin[n_chunks // 2 :] *= 20
        for _ in range(10):  # fresh counters on each call
            runs = np.zeros(n_chunks, np.int64)
            first = np.full(MAX_SEGMENTS, -1, np.int64)
            n_seg = _run_chunks(n_chunks, runs, first, spin)
            assert n_seg == max(1, min(threads, n_chunks))  # split among the threads
            assert np.array_equal(runs, np.ones(n_chunks, np.int64))
            # every task that ran a chunk began inside some segment's range (its own, unless
            # a late start found it already done by the others)
            assert set(first[first >= 0].tolist()) <= set(range(n_chunks))
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


def test_one_task_per_thread_and_never_more_than_chunks():
    assert n_workers(0) == 1
    assert n_workers(1) == 1
    assert n_workers(10**6) == min(numba.get_num_threads(), MAX_SEGMENTS)
