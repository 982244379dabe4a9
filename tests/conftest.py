"""Shared fixtures. Real models are fetched by `.ci/run` (scripts/fetch_models.py) into the
user model cache; tests that need one skip cleanly when it is absent."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# CUDA kernels run in numba-cuda's simulator unless told otherwise (NUMBA_ENABLE_CUDASIM=0 on
# a machine with a GPU runs the same tests on it); set before anything imports numba.cuda
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
if os.environ["NUMBA_ENABLE_CUDASIM"] == "1":
    # the simulator's barriers wait for threads that wait for the GIL: a 0.5 ms switch
    # interval instead of 5 ms runs its kernels ~5x faster
    sys.setswitchinterval(0.0005)

pytest_plugins = ["skip_policy"]  # --allowed-skips FILE: fail on a skip FILE does not allow


def find_real_model(filename: str) -> Path | None:
    from edgeinfer.pull import models_dir

    path = models_dir() / filename
    return path if path.exists() else None


@pytest.fixture(scope="session")
def real_model():
    """real_model(filename) -> Path of a pulled model, or skip the test."""

    def get(filename: str) -> Path:
        path = find_real_model(filename)
        if path is None:
            pytest.skip(f"real model {filename} not pulled (run scripts/fetch_models.py)")
        return path

    return get
