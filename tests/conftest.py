"""Shared fixtures. Real models are fetched by `.ci/run` (scripts/fetch_models.py) into the
user model cache; tests that need one skip cleanly when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest


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
