"""Batch invariance of the matrix products: a token's output does not depend on which other
tokens share its batch or tile. Continuous batching in the server relies on it (greedy output
of concurrent requests equals each request alone), and so does "cached decode == prefill"."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from tiny_models import random_weight

from edgeinfer.linear import ActScratch, Linear, project

TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1,
         Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_rows_are_bit_identical_in_any_batch(qtype):
    rng = np.random.default_rng(int(qtype))
    n_out, n_in, n_tok = 70, 512, 19
    weight = random_weight(rng, (n_out, n_in), qtype)
    lin = Linear.from_tensor("w", qtype, weight, (n_out, n_in))
    scratch = ActScratch(n_tok, n_in)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    full = np.zeros((n_tok, n_out), np.float32)
    project(x, (lin,), (full,), scratch)
    for size in (1, 2, 3, 5, 8, 9):
        part = np.zeros((size, n_out), np.float32)
        for start in range(0, n_tok - size + 1, 3):
            project(np.ascontiguousarray(x[start : start + size]), (lin,), (part,), scratch)
            np.testing.assert_array_equal(part, full[start : start + size])


def test_shared_input_with_alternating_activation_formats():
    """project() converts x once per run of weights sharing an activation format; the
    formats share scratch buffers, so Q8_0, then Q8_K (Q4_K), then Q8_0 again must each see
    x in their own format: the result equals each product on its own."""
    rng = np.random.default_rng(7)
    n_in, n_tok = 512, 5
    lins = [Linear.from_tensor(f"w{i}", q, random_weight(rng, (n_out, n_in), q), (n_out, n_in))
            for i, (q, n_out) in enumerate([(Q.Q8_0, 24), (Q.Q4_K, 16), (Q.Q5_0, 32)])]
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    scratch = ActScratch(n_tok, n_in)
    together = [np.zeros((n_tok, lin.n_out), np.float32) for lin in lins]
    project(x, tuple(lins), tuple(together), scratch)
    for lin, out in zip(lins, together):
        alone = np.zeros_like(out)
        project(x, (lin,), (alone,), ActScratch(n_tok, n_in))
        np.testing.assert_array_equal(out, alone)
