"""Speculative decoding in the server (issue 39), in-process: speculating and plain sequences
share one continuous batch, and every request gets the tokens, texts, stops, limits and
log-probabilities it gets without speculation, with drafted and accepted counts in its
timings; rejected drafts leave no KV block behind."""

from __future__ import annotations

import queue
from dataclasses import replace

import numpy as np
import pytest
from test_server_paged import check_no_leak
from test_spec import repetitive_prompts
from tiny_models import Q, write_tiny_model

from edgeinfer.sampling_params import SamplingParams
from edgeinfer.server.engine import Engine, ErrorEvent, FinalEvent, Job, TokenEvent
from edgeinfer.server.options import ServerSettings
from edgeinfer.server.params import GenParams
from edgeinfer.spec import SpecParams

GREEDY = GenParams(sampling=SamplingParams(temperature=0), ignore_eos=True)
NGRAM = SpecParams("ngram-simple", n_max=8, ngram_size_n=1, ngram_size_m=8)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("spec") / "tiny.gguf", n_ctx_train=2048)


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    """The target's weights in Q4_0: it mostly agrees with the target, not always."""
    return write_tiny_model(tmp_path_factory.mktemp("draft") / "draft.gguf", qtype=Q.Q4_0,
                            n_ctx_train=2048)


@pytest.fixture(scope="module")
def engines(model):
    """One engine per settings, kept for the module: (plain, speculating)."""
    started = {}

    def get(**settings) -> Engine:
        key = tuple(sorted(settings.items()))
        if key not in started:
            eng = Engine(model, ServerSettings(n_slots=8, n_ctx=4096, **settings))
            eng.start()
            assert eng.ready.wait(120), "the engine did not load"
            started[key] = eng
        return started[key]

    yield get
    for eng in started.values():
        eng.stop()
        eng.join(10)


def run_together(eng: Engine, prompts, params: GenParams | list[GenParams]):
    """Submit every prompt at once; (token events, final event) of each, in order."""
    params = params if isinstance(params, list) else [params] * len(prompts)
    sinks = [queue.SimpleQueue() for _ in prompts]
    for prompt, p, sink in zip(prompts, params, sinks):
        eng.submit(Job(list(prompt), p, sink.put))
    out = []
    for sink in sinks:
        events = []
        while True:
            event = sink.get(timeout=60)
            if isinstance(event, ErrorEvent):
                raise AssertionError(event.error)
            if isinstance(event, FinalEvent):
                out.append((events, event))
                break
            events.append(event)
    return out


def tokens(result) -> list[list[int]]:
    return [[e.token for e in events if isinstance(e, TokenEvent)] for events, _ in result]


def text(events, final) -> str:
    return "".join(e.text for e in events if isinstance(e, TokenEvent)) + final.text


def mixed_prompts(rng, n: int) -> list[list[int]]:
    """Half repeat phrases (drafts are found and kept), half are random (none are)."""
    out = []
    for i in range(n):
        if i % 2:
            out.append(rng.integers(3, 250, int(rng.integers(5, 60))).tolist())
            continue
        out += repetitive_prompts(rng, 1)
    return out


def test_eight_requests_in_one_batch_give_plain_tokens(engines):
    """Eight at once, of different lengths: while all eight decode the tile of 8 rows is
    full and nobody drafts; as they finish, some draft into the free rows while others
    decode plainly in the same forward."""
    rng = np.random.default_rng(0)
    prompts = mixed_prompts(rng, 16)
    params = [replace(GREEDY, n_predict=8 + 8 * (i % 8)) for i in range(16)]
    plain = tokens(run_together(engines(), prompts, params))
    eng = engines(spec=NGRAM)
    for first in (0, 8):
        spec = run_together(eng, prompts[first : first + 8], params[first : first + 8])
        assert tokens(spec) == plain[first : first + 8]
    drafted = eng.stats.draft_tokens
    assert 0 < eng.stats.draft_accepted < drafted
    finals = [final for _, final in spec]
    assert any(f.timings.get("draft_n", 0) > 0 for f in finals)  # as llama-server's
    assert all(f.timings.get("draft_n_accepted", 0) <= f.timings.get("draft_n", 0)
               for f in finals)
    check_no_leak(eng)


def test_a_full_tile_drafts_nothing(engines):
    rng = np.random.default_rng(5)
    eng = engines(spec=NGRAM)
    before = eng.stats.draft_tokens
    run_together(eng, mixed_prompts(rng, 8), replace(GREEDY, n_predict=24))  # end together
    assert eng.stats.draft_tokens == before


def test_seeded_sampling_gives_plain_tokens(engines):
    rng = np.random.default_rng(1)
    prompts = mixed_prompts(rng, 8)
    params = [GenParams(sampling=SamplingParams(temperature=0.9, seed=s, top_k=0, top_p=1.0,
                                                min_p=0.0), n_predict=48, ignore_eos=True)
              for s in range(8)]
    assert tokens(run_together(engines(spec=NGRAM), prompts, params)) == \
        tokens(run_together(engines(), prompts, params))


def test_limits_stops_and_logprobs_at_draft_boundaries(engines):
    rng = np.random.default_rng(2)
    prompt = mixed_prompts(rng, 1)[0]
    eng, ref = engines(spec=NGRAM), engines()
    [(events, final)] = run_together(ref, [prompt], replace(GREEDY, n_predict=60))
    whole = text(events, final)
    lengths = list(range(1, 40, 3))  # wherever a draft ends
    limited = [replace(GREEDY, n_predict=n) for n in lengths]
    got = run_together(eng, [prompt] * len(lengths), limited)
    want = run_together(ref, [prompt] * len(lengths), limited)
    assert tokens(got) == tokens(want)
    assert [len(t) for t in tokens(got)] == lengths
    for cut in (5, 17, 30):
        stop = whole[cut : cut + 3]
        [(events, final)] = run_together(eng, [prompt], replace(GREEDY, n_predict=60,
                                                                 stop=(stop,)))
        assert text(events, final) == whole[: whole.index(stop)]
        assert final.stop_type == "word" and final.stopping_word == stop
    probs = replace(GREEDY, n_predict=40, n_probs=3, logprobs=True)
    [(got, _)] = run_together(eng, [prompt], probs)
    [(want, _)] = run_together(ref, [prompt], probs)
    assert [e.probs for e in got] == [e.probs for e in want]
    check_no_leak(eng)


def test_per_request_draft_sizes(engines):
    eng = engines(spec=NGRAM)
    prompt = mixed_prompts(np.random.default_rng(3), 1)[0]
    [(_, off)] = run_together(eng, [prompt], replace(GREEDY, n_predict=40, spec_n_max=0))
    assert "draft_n" not in off.timings  # speculative.n_max 0: nothing drafted
    [(_, small)] = run_together(eng, [prompt], replace(GREEDY, n_predict=40, spec_n_max=1))
    [(_, big)] = run_together(eng, [prompt], replace(GREEDY, n_predict=40))
    assert 0 < small.timings["draft_n"] < big.timings["draft_n"]
    [(_, picky)] = run_together(eng, [prompt], replace(GREEDY, n_predict=40, spec_n_min=50))
    drafted = picky.timings["draft_n"]  # n_min is at most n_max (8), as llama.cpp's
    assert drafted > 0 and drafted % 8 == 0


def test_draft_model_in_the_batch(model, draft):
    rng = np.random.default_rng(4)
    prompts = mixed_prompts(rng, 6)
    params = replace(GREEDY, n_predict=32)
    engs = [Engine(model, ServerSettings(n_slots=6, n_ctx=2048, spec=spec)) for spec in
            (SpecParams(), SpecParams("draft-simple", n_max=4, draft_model=str(draft)))]
    try:
        for eng in engs:
            eng.start()
            assert eng.ready.wait(120)
        plain, spec = (run_together(eng, prompts, params) for eng in engs)
        assert tokens(spec) == tokens(plain)
        assert 0 < engs[1].stats.draft_accepted < engs[1].stats.draft_tokens
        check_no_leak(engs[1])
    finally:
        for eng in engs:
            eng.stop()
            eng.join(10)
