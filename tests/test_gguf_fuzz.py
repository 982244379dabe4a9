"""The seeded GGUF fuzzer (issue 32): hypothesis mutates the header fields and values of small
valid models (tests/gguf_fuzz.py: kv values, types and counts, nested arrays, strings with
markup and control characters, tensor dims, types, offsets and names, lying counts,
truncations, byte flips, NaN weights) and every case must end as "ok" or "refused" (an
EdgeInferError, one short printable line): no traceback, no signal, no hang.

In process (loader, checks, tokenizer tables, weight views, `info` rendering): 2,000 cases
per CI run, a 200-case sample in the quick loop. Through the real CLI (`info` and `run` as
subprocesses): 24 cases in CI, 4 in the quick loop, half of them with a valid header whose
strings or weights are odd, so `run` renders templates, generates and samples.
scripts/fuzz_gguf.py runs longer.
"""

from __future__ import annotations

from collections import Counter

import pytest
from gguf_fuzz import check_cli, check_in_process, mutate, mutate_mild, read_layout, write_base
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

ARCHES = ("llama", "gemma3", "phi3")


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    return {arch: read_layout(write_base(folder / f"{arch}.gguf", arch)) for arch in ARCHES}


def fuzz(bases, path, n_cases: int, seed_value: int, check, mild: bool = False) -> Counter:
    """Run n_cases seeded cases; a failure fails the test (after hypothesis shrinks it).
    mild: half the cases keep a valid header (`mutate_mild`), to reach generation."""
    counts: Counter = Counter()

    @seed(seed_value)
    @settings(max_examples=n_cases, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def case(data):
        layout = bases[data.draw(st.sampled_from(ARCHES))]
        gentle = mild and data.draw(st.booleans())
        path.write_bytes((mutate_mild if gentle else mutate)(data.draw, layout))
        outcome = check(path)
        counts[outcome.status] += 1
        assert outcome.status != "failure", outcome.detail

    case()
    return counts


@pytest.mark.parametrize("n_cases, seed_value", [
    pytest.param(200, 1, id="quick"),
    pytest.param(2000, 32, id="ci", marks=pytest.mark.slow),
])
def test_fuzz_in_process(bases, tmp_path, n_cases, seed_value):
    counts = fuzz(bases, tmp_path / "case.gguf", n_cases, seed_value, check_in_process)
    print(f"in-process GGUF fuzz, seed {seed_value}: {dict(counts)}")
    assert sum(counts.values()) >= n_cases
    assert counts["ok"] and counts["refused"]  # the mutations reach past the header


@pytest.mark.parametrize("n_cases, seed_value", [
    pytest.param(4, 2, id="quick"),
    pytest.param(24, 33, id="ci", marks=pytest.mark.slow),
])
def test_fuzz_cli(bases, tmp_path, n_cases, seed_value):
    def both(path):  # `info`, then `run` unless info found a failure
        outcome = check_cli(path, "info", timeout=120)
        return outcome if outcome.status == "failure" else check_cli(path, "run", timeout=300)

    counts = fuzz(bases, tmp_path / "case.gguf", n_cases, seed_value, both, mild=True)
    print(f"CLI GGUF fuzz, seed {seed_value}: {dict(counts)}")
    assert sum(counts.values()) >= n_cases
