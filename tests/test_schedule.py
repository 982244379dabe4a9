"""Dynamic chunk scheduling (kernels/schedule.py): every chunk runs once, whatever the threads."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import njit, prange

from edgeinfer.kernels.schedule import chunk_counter, n_workers, next_chunk


@njit(parallel=True, nogil=True)
def _run_chunks(n_chunks, runs, worker):
    counter = chunk_counter()
    for task in prange(n_workers(n_chunks)):
        c = next_chunk(counter)
        while c < n_chunks:
            runs[c] += 1
            worker[c] = task
            for _ in range(1000 * (c % 7)):  # uneven chunk costs
                runs[c] += 0
            c = next_chunk(counter)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n_chunks", [0, 1, 3, 257])
def test_every_chunk_runs_exactly_once(threads, n_chunks):
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        for _ in range(20):  # fresh counter on each call
            runs = np.zeros(n_chunks, np.int64)
            worker = np.full(n_chunks, -1, np.int64)
            _run_chunks(n_chunks, runs, worker)
            assert np.array_equal(runs, np.ones(n_chunks, np.int64))
            assert (worker >= 0).all()
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


def test_one_task_per_thread_and_never_more_than_chunks():
    assert n_workers(0) == 1
    assert n_workers(1) == 1
    assert n_workers(10**6) == numba.get_num_threads()
