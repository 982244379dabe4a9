"""The server's KV block pool (issue 38), in-process: sequences share prefix blocks by
reference, wait for room or are preempted when the pool is full, and still give exactly the
greedy tokens each request gives alone; when they are done the pool holds no stray block.
The model-level check: logits through a shuffled, shared block table equal the contiguous
cache's bit for bit."""

from __future__ import annotations

import queue
from dataclasses import replace

import numpy as np
import pytest
from tiny_models import write_tiny_model

from edgeinfer.sampling_params import SamplingParams
from edgeinfer.server.engine import Engine, ErrorEvent, FinalEvent, Job, TokenEvent
from edgeinfer.server.options import ServerSettings
from edgeinfer.server.params import GenParams

GREEDY = GenParams(sampling=SamplingParams(temperature=0), ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("paged") / "tiny.gguf", n_ctx_train=2048)


@pytest.fixture
def engines():
    started = []

    def start(path, **settings) -> Engine:
        eng = Engine(path, ServerSettings(**settings))
        eng.start()
        assert eng.ready.wait(120), "the engine did not load"
        started.append(eng)
        return eng

    yield start
    for eng in started:
        eng.stop()
        eng.join(10)


def run_together(eng: Engine, prompts, params: GenParams):
    """Submit every prompt at once; (tokens, final event) of each, in order."""
    sinks = [queue.SimpleQueue() for _ in prompts]
    for prompt, sink in zip(prompts, sinks):
        eng.submit(Job(list(prompt), params, sink.put))
    out = []
    for sink in sinks:
        tokens = []
        while True:
            event = sink.get(timeout=60)
            if isinstance(event, TokenEvent):
                tokens.append(event.token)
            elif isinstance(event, ErrorEvent):
                raise AssertionError(event.error)
            elif isinstance(event, FinalEvent):
                out.append((tokens, event))
                break
    return out


def alone(eng: Engine, prompts, params: GenParams):
    no_cache = replace(params, cache_prompt=False)
    return [run_together(eng, [p], no_cache)[0][0] for p in prompts]


def check_no_leak(eng: Engine) -> None:
    """Once every request has ended: the pool's books balance, the only blocks in use are
    those idle slots keep, and giving those back leaves every block free or evictable."""
    pool, kv = eng.kv.pool, eng.kv
    pool.check()
    held = sum(len(t.blocks) for t in kv.tables)
    assert pool.n_used <= held  # shared blocks are counted once
    for slot in eng.slots:
        assert slot.job is None and not slot.stalled
        kv.release(slot.id, slot.cache)
        slot.cache = []
    pool.check()
    assert pool.n_used == 0 and pool.n_available == pool.n_blocks
    assert (kv.kv.tables == -1).all()


def prompts_with_a_shared_prefix(n: int, shared: int, rng) -> list[list[int]]:
    system = rng.integers(3, 200, shared).tolist()
    return [system + rng.integers(3, 200, int(rng.integers(3, 40))).tolist()
            for _ in range(n)]


def test_concurrent_requests_sharing_a_prefix_give_their_tokens_alone(model, engines):
    rng = np.random.default_rng(0)
    prompts = prompts_with_a_shared_prefix(6, 150, rng)  # two full blocks of 64 shared
    params = replace(GREEDY, n_predict=24)
    solo = alone(engines(model, n_slots=1, n_ctx=512), prompts, params)
    eng = engines(model, n_slots=6, n_ctx=2048)
    together = run_together(eng, prompts, params)
    assert [tokens for tokens, _ in together] == solo
    # the first request computed the shared prefix; the others referenced its blocks (the
    # block with the prefix's last 22 tokens copied), computing only their own tails
    cached = sorted(final.n_cached for _, final in together)
    assert cached[0] == 0 and all(c >= 150 for c in cached[1:]), cached
    assert eng.kv.radix  # the prefix's blocks are in the tree
    check_no_leak(eng)


def test_more_sequences_than_the_pool_holds(model, engines):
    """Six sequences of ~110 cells (two blocks each) in a pool of four blocks: some wait,
    running ones are preempted as they grow, and all finish with their tokens alone."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 200, int(rng.integers(30, 50))).tolist() for _ in range(6)]
    params = replace(GREEDY, n_predict=60)
    solo = alone(engines(model, n_slots=1, n_ctx=512), prompts, params)
    eng = engines(model, n_slots=6, n_ctx=256)
    assert eng.kv.pool.n_blocks == 4
    together = run_together(eng, prompts, params)
    assert [tokens for tokens, _ in together] == solo
    assert eng.stats.n_preempted > 0
    check_no_leak(eng)


def test_shared_prefixes_under_pressure(model, engines):
    """Shared prefixes, preemption and reclaimed idle slots at once, twice over (the
    second round starts from what the first left cached)."""
    rng = np.random.default_rng(2)
    prompts = prompts_with_a_shared_prefix(8, 100, rng)
    params = replace(GREEDY, n_predict=40)
    solo = alone(engines(model, n_slots=1, n_ctx=512), prompts, params)
    eng = engines(model, n_slots=5, n_ctx=512)
    for _ in range(2):
        together = run_together(eng, prompts, params)
        assert [tokens for tokens, _ in together] == solo
    eng.kv.pool.check()
    check_no_leak(eng)


def test_a_sequence_stops_at_its_limit(model, engines):
    """--kv-unified-per-slot: a request's cells are capped below the pool's; it stops there
    with truncated set (there is no context shift)."""
    eng = engines(model, n_slots=2, n_ctx=1024, n_ctx_slot=128)
    assert eng.n_ctx == 128 and eng.kv.n_cells == 1024
    [(tokens, final)] = run_together(eng, [list(range(3, 103))], replace(GREEDY, n_predict=-1))
    assert final.truncated and final.stop_type == "limit"
    assert final.tokens_cached == 128 and len(tokens) == 29
    check_no_leak(eng)


def test_paged_logits_equal_contiguous(model):
    """Two sequences through one pool, their blocks shuffled, the first block shared by
    reference: every logit equals the contiguous cache's, bit for bit."""
    from edgeinfer.api import Model

    rng = np.random.default_rng(3)
    head = rng.integers(3, 200, 64).tolist()  # one full block, shared
    tails = [rng.integers(3, 200, 90).tolist(), rng.integers(3, 200, 70).tolist()]
    flat = Model.load(model, n_ctx=256, warm_up=False)
    want = [flat.logits(head + tail) for tail in tails]
    paged = Model.load(model, n_ctx=256, n_slots=2, kv_cells=8 * 64, warm_up=False)
    tf, v = paged.transformer, paged.config.n_vocab
    tables = tf.kv_cache.tables
    tables[0, :3] = [5, 2, 7]
    tables[1, :3] = [5, 0, 3]  # block 5 (the head) shared
    logits = np.zeros((len(head), v), np.float32)
    rows = np.arange(len(head), dtype=np.int32)
    tf.forward(np.array(head, np.int32), rows, np.zeros(len(head), np.int32), rows, logits)
    np.testing.assert_array_equal(logits, want[0][: len(head)])
    for slot, tail in enumerate(tails):
        n = len(tail)
        pos = np.arange(len(head), len(head) + n, dtype=np.int32)
        out = np.zeros((n, v), np.float32)
        tf.forward(np.array(tail, np.int32), pos, np.full(n, slot, np.int32),
                   np.arange(n, dtype=np.int32), out)
        np.testing.assert_array_equal(out, want[slot][len(head):])


def test_a_reused_prefix_that_leaves_no_room_does_not_wait_forever(model, engines):
    """A four-block pool without RAM cache; a first sequence leaves three full blocks in the
    tree; a prompt shares its first two and some rows of the third and needs all four
    blocks: reusing the third would hold it while copying it (five blocks), on every look.
    With nobody running it does not wait forever: it computes the prompt from scratch."""
    rng = np.random.default_rng(4)
    first = rng.integers(3, 200, 200).tolist()
    second = first[:140] + rng.integers(3, 200, 115).tolist()  # 255 tokens: 4 blocks
    params = replace(GREEDY, n_predict=10)
    solo = alone(engines(model, n_slots=1, n_ctx=512), [second], replace(params, n_predict=1))
    eng = engines(model, n_slots=2, n_ctx=256, cache_ram_mib=0)
    run_together(eng, [first], replace(params, id_slot=0))
    [(tokens, final)] = run_together(eng, [second], replace(params, id_slot=1, n_predict=1))
    assert tokens == solo[0] and final.n_cached == 0
    check_no_leak(eng)
