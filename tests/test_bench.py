"""edgeinfer.bench against a recording stand-in for the transformer: what each test feeds."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from edgeinfer.bench import run_bench


class Recorder:
    """Records (first position, n tokens, n logit rows) of every forward."""

    flash_attn = False
    device, gpu_layers = None, 0  # all on the CPU

    def __init__(self):
        self.calls: list[tuple[int, int, int]] = []

    def forward(self, tokens, positions, slots, rows, logits):
        assert len(tokens) == len(positions) == len(slots) and (slots == 0).all()
        assert (np.diff(positions) == 1).all()
        self.calls.append((int(positions[0]), len(tokens), len(rows)))


def fake_model() -> SimpleNamespace:
    config = SimpleNamespace(n_vocab=50, arch="llama", name="fake")
    return SimpleNamespace(config=config, path="fake.gguf", transformer=Recorder())


def test_depth_fills_once_then_every_run_starts_after_it():
    model = fake_model()
    rows = run_bench(model, n_prompt=5, n_gen=3, reps=2, threads=1, depth=7)
    warm_up = [(0, 5, 1), (0, 1, 1), (1, 1, 1), (2, 1, 1)]
    fill = [(0, 7, 0)]
    pp = [(7, 5, 1)] * 2
    tg = [(7, 1, 1), (8, 1, 1), (9, 1, 1)] * 2
    assert model.transformer.calls == warm_up + fill + pp + tg
    assert [(r.test, r.n_depth, len(r.samples_ts)) for r in rows] == [
        ("pp5 @ d7", 7, 2), ("tg3 @ d7", 7, 2)]


def test_without_depth_tests_start_at_zero():
    model = fake_model()
    run_bench(model, n_prompt=4, n_gen=0, reps=3, threads=1)
    assert model.transformer.calls == [(0, 4, 1)] * 4  # warm-up, then 3 runs, no fill
