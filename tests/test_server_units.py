"""Server pieces without a socket: the prefix tree, request parsing, the loading state."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient

from edgeinfer.server.app import Server, create_app
from edgeinfer.server.engine import Engine
from edgeinfer.server.errors import ApiError
from edgeinfer.server.params import (
    Vocab,
    gen_params,
    parse_chat,
    parse_completion,
    parse_prompts,
)
from edgeinfer.server.prefix import PrefixTree


# -- prefix tree ---------------------------------------------------------------------------
def test_prefix_tree_match_per_slot():
    tree = PrefixTree()
    tree.set(0, [1, 2, 3, 4, 5])
    tree.set(1, [1, 2, 3, 9])
    tree.set(2, [7, 8])
    assert tree.match([1, 2, 3, 4, 6]) == {0: 4, 1: 3, 2: 0}
    assert tree.match([1, 2, 3, 9, 9, 9]) == {0: 3, 1: 4, 2: 0}
    assert tree.match([7]) == {0: 0, 1: 0, 2: 1}
    assert tree.match([]) == {0: 0, 1: 0, 2: 0}


def test_prefix_tree_replace_and_remove():
    tree = PrefixTree()
    tree.set(0, [1, 2, 3])
    tree.set(1, [1, 2, 3])
    tree.set(0, [1, 5])
    assert tree.match([1, 2, 3]) == {0: 1, 1: 3}
    tree.remove(1)
    assert tree.match([1, 2, 3]) == {0: 1}
    assert list(tree.root.children) == [1]  # slot 1's branch is pruned
    tree.set(1, [])
    assert tree.match([1, 5, 6]) == {0: 2, 1: 0}


def test_prefix_tree_random_against_brute_force():
    import random

    rng = random.Random(0)
    tree, seqs = PrefixTree(), {}
    for _ in range(300):
        slot = rng.randrange(4)
        seq = [rng.randrange(3) for _ in range(rng.randrange(12))]
        tree.set(slot, seq)
        seqs[slot] = seq
        query = [rng.randrange(3) for _ in range(rng.randrange(12))]

        def lcp(a, b):
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            return n
        assert tree.match(query) == {s: lcp(q, query) for s, q in seqs.items()}


# -- request parsing -----------------------------------------------------------------------
def test_completion_params_defaults_and_aliases():
    req = parse_completion({"prompt": "hi"}, oai=False)
    p = req.params
    assert req.prompts == [["hi"]]
    assert (p.n_predict, p.sampling.temperature, p.sampling.top_k, p.sampling.seed) == \
        (-1, 0.8, 40, None)
    p = parse_completion({"prompt": "x", "max_tokens": 5, "n_predict": 7}, oai=False).params
    assert p.n_predict == 7  # n_predict beats max_tokens
    p = parse_completion({"prompt": "x", "stop": "\n", "seed": 3}, oai=True).params
    assert p.stop == ("\n",) and p.sampling.seed == 3
    assert parse_completion({"prompt": "x", "logprobs": 2}, oai=True).params.n_probs == 2


def test_prompt_shapes():
    assert parse_prompts([1, 2, 3]) == [[1, 2, 3]]
    assert parse_prompts([1, "a", 2]) == [[1, "a", 2]]
    assert parse_prompts(["a", "b"]) == [["a"], ["b"]]
    assert parse_prompts([[1, 2], "b"]) == [[1, 2], ["b"]]
    assert parse_prompts([5.0, "a"]) == [[5, "a"]]  # an integral number is an id
    for bad in (None, 3, [], [True], [1.5], {"a": 1}):
        with pytest.raises(ApiError):
            parse_prompts(bad)


def test_chat_parsing():
    req = parse_chat({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "logprobs": True, "top_logprobs": 2, "stream": True,
        "stream_options": {"include_usage": True}})
    assert req.params.n_probs == 2 and req.params.logprobs and req.params.include_usage
    with pytest.raises(ApiError, match="top_logprobs requires logprobs"):
        parse_chat({"messages": [], "top_logprobs": 2})


# -- loading state -------------------------------------------------------------------------
def test_every_route_is_503_while_loading(tmp_path):
    engine = Engine(tmp_path / "never-loaded.gguf")  # not started: stays "loading"
    client = TestClient(create_app(Server(engine, tmp_path / "never-loaded.gguf")),
                        base_url="http://localhost")  # "testserver" fails the Host guard
    for method, path in (("GET", "/health"), ("GET", "/v1/models"),
                         ("POST", "/v1/chat/completions"), ("POST", "/completion")):
        r = client.request(method, path, json={})
        assert r.status_code == 503
        assert r.json() == {"error": {"code": 503, "message": "Loading model",
                                      "type": "unavailable_error"}}


def test_prompt_cache_saves_restores_and_evicts():
    import numpy as np

    from edgeinfer.model import KVCache
    from edgeinfer.server.prompt_cache import MIN_TOKENS, PromptCache

    n = MIN_TOKENS
    k = np.arange(2 * 2 * 64 * 3, dtype=np.uint16).reshape(2, 2, 64, 3)  # (layer, slot, ctx, d)
    v = k + 1
    entry_bytes = 2 * k[:, 0, :n].nbytes
    cache = PromptCache(KVCache(k, v), budget_bytes=2 * entry_bytes)
    first, second, third = (list(range(start, start + n)) for start in (100, 200, 300))
    assert cache.save(0, first)  # slot 0's cells 0..n-1 now also live as entry 0
    assert cache.best(first + [7]) == (0, n) and cache.best([5, 6]) == (-1, 0)
    saved_k = k[:, 0, :n].copy()
    k[:, 0] = 0  # slot 0 overwritten by something else
    cache.restore(0, 1, n)
    np.testing.assert_array_equal(k[:, 1, :n], saved_k)
    assert not cache.save(0, first[: n - 1])  # too short to keep
    assert not cache.save(0, first)  # held whole already
    cache.save(0, second)
    cache.save(0, third)  # over budget: the least recently used entry (first) goes
    assert not cache.holds(0) and cache.best(first) == (-1, 0)
    assert cache.best(third) == (2, n) and cache.n_bytes == 2 * entry_bytes
    assert len(cache.entries) == 2


def test_prompt_cache_never_evicts_the_entry_about_to_be_restored():
    import numpy as np

    from edgeinfer.model import KVCache
    from edgeinfer.server.prompt_cache import MIN_TOKENS, PromptCache

    n = MIN_TOKENS
    k = np.zeros((1, 2, 64, 2), np.uint16)
    cache = PromptCache(KVCache(k, k.copy()), budget_bytes=2 * k[:, 0, :n].nbytes)  # one entry
    old, new = list(range(n)), list(range(100, 100 + n))
    cache.save(0, old)
    (entry,) = cache.entries
    cache.save(0, new, keep=entry)  # would only fit by evicting `entry`: not saved
    assert cache.holds(entry) and len(cache.entries) == 1
    cache.restore(entry, 1, n)
    cache.save(0, new)  # without a restore pending it replaces the old entry
    assert not cache.holds(entry) and len(cache.entries) == 1


# -- the OpenAPI description ---------------------------------------------------------------
def test_openapi_describes_every_route():
    from edgeinfer.server.app import PUBLIC, ROUTES
    from edgeinfer.server.openapi import openapi_schema

    schema = openapi_schema(n_vocab=100, n_slots=2, api_key=True, public=PUBLIC)
    described = {(method.lower(), path) for path, item in schema["paths"].items()
                 for method in item}
    assert described == {(method.lower(), path) for method, path, _ in ROUTES}
    for path, item in schema["paths"].items():
        for op in item.values():
            assert ("401" in op["responses"]) == (path not in PUBLIC), path
    prompt = schema["components"]["schemas"]["CompletionRequest"]["properties"]["prompt"]
    assert prompt["anyOf"][1]["items"]["anyOf"][0]["maximum"] == 99  # a token id


# -- logit_bias, n_cmpl, JSON-object prompts (params.py) ------------------------------------
FAKE_VOCAB = Vocab(n_vocab=100, eog=(2, 3), tokenize=lambda text: [10 + len(w) for w in
                                                                 text.split()])


def bias_of(body: dict, vocab: Vocab | None = FAKE_VOCAB) -> tuple:
    return gen_params({"prompt": "x", **body}, vocab=vocab).logit_bias


def test_logit_bias_forms_as_llama_server():
    inf = math.inf
    assert bias_of({"logit_bias": [[5, -1.5], [7, False]]}) == ((5, -1.5), (7, -inf))
    assert bias_of({"logit_bias": {"5": 2, " 6": -1, "+7": 0.5}}) == (
        (5, 2.0), (6, -1.0), (7, 0.5))  # integer keys are ids, as strtol reads them
    assert bias_of({"logit_bias": {"ab cde": -3}}) == ((12, -3.0), (13, -3.0))  # tokenized
    assert bias_of({"logit_bias": [["15", 1]]}) == ((12, 1.0),)  # a pair's string is text
    assert bias_of({"logit_bias": [[5.0, 1]]}) == ((5, 1.0),)
    assert bias_of({"logit_bias": None}) == bias_of({}) == ()
    assert bias_of({"ignore_eos": True, "logit_bias": [[1, 1]]}) == (
        (1, 1.0), (2, -inf), (3, -inf))  # EOG biases after the request's own


@pytest.mark.parametrize("value", ["x", 5, [[1]], [[1, 2, 3]], [1, 2], [[1, None]],
                                   [[1, True]], {"1": "a"}, [[100, 1]], [[-1, 1]],
                                   {"100": 1}, [[None, 1]]])
def test_bad_logit_bias_is_refused(value):
    with pytest.raises(ApiError):
        bias_of({"logit_bias": value})


def test_logit_bias_strings_need_a_vocab():
    assert bias_of({"logit_bias": [[5, 1]]}, vocab=None) == ((5, 1.0),)
    with pytest.raises(ApiError):
        bias_of({"logit_bias": [["text", 1]]}, vocab=None)


def test_n_cmpl_and_n():
    assert gen_params({}).n_cmpl == 1
    assert gen_params({"n": 3}).n_cmpl == 3
    assert gen_params({"n": 3, "n_cmpl": 2}).n_cmpl == 2  # n_cmpl first, as llama-server
    for bad in ({"n": 0}, {"n_cmpl": 0}, {"n": "2"}, {"n": 2, "n_cmpl": -1}, {"n": 0,
                                                                              "n_cmpl": 1}):
        with pytest.raises(ApiError):
            gen_params(bad)


def test_json_object_prompts():
    assert parse_prompts({"prompt_string": "hi"}) == [["hi"]]
    assert parse_prompts({"prompt_string": [1, "hi"]}) == [[1, "hi"]]
    assert parse_prompts([{"prompt_string": "a"}, "b"]) == [["a"], ["b"]]
    for bad in ({"prompt_string": {"prompt_string": "x"}}, {"text": "x"},
                {"prompt_string": "x", "multimodal_data": ["aGk="]}, [1, {"prompt_string": "x"}]):
        with pytest.raises(ApiError):
            parse_prompts(bad)
