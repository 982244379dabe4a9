"""Prefix-affine routing between replicas: a request goes to the replica that already served
the longest prefix of its prompt (its KV cache and prompt cache likely hold it), unless that
replica is busier than the others; with no match, the less loaded of two random replicas.

A prompt is summarised as a chain of hashes, one per BLOCK characters (each hash covers the
whole text up to it), so "system prompt + turn 1" and "system prompt + turns 1-2" share the
leading links. Each replica remembers the links of the requests routed to it (a bounded LRU).
This is the cache-aware routing of SGLang's router and Ray's PrefixCacheAffinityRouter, on
characters in blocks, kept in the router itself (no tree actor)."""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter

BLOCK = 64  # characters per link
MAX_LINKS = 256  # a prompt's first 16k characters decide


def prompt_text(body: dict) -> str:
    """The text a request's KV cache starts with, in order: the model, a system prompt,
    the messages' roles and contents (OpenAI, Anthropic), or the prompt (completions)."""
    parts = [str(body.get("model", ""))]
    if body.get("system") is not None:
        parts.append(json.dumps(body["system"], ensure_ascii=False))
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                content = m.get("content")
                text = content if isinstance(content, str) else json.dumps(
                    content, ensure_ascii=False)
                parts.append(f"{m.get('role', '')}: {text}")
    elif "prompt" in body:
        p = body["prompt"]
        parts.append(p if isinstance(p, str) else json.dumps(p))
    return "\n".join(parts)


def prefix_chain(body: bytes) -> tuple[int, ...]:
    """One hash per whole BLOCK of the request's prompt text; () for a body that is not a
    JSON object (GETs, malformed bodies: routed by load alone)."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return ()
    if not isinstance(parsed, dict):
        return ()
    text = prompt_text(parsed).encode()
    h, chain = hashlib.blake2b(digest_size=8), []
    for start in range(0, min(len(text), BLOCK * MAX_LINKS) - BLOCK + 1, BLOCK):
        h.update(text[start:start + BLOCK])
        chain.append(int.from_bytes(h.copy().digest(), "little"))
    return tuple(chain)


def matched_links(chain: tuple[int, ...], seen) -> int:
    """How many leading links of `chain` a replica has seen."""
    n = 0
    for link in chain:
        if link not in seen:
            break
        n += 1
    return n


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """Ray Serve request router for the engine deployment (request_router_config)."""

    def initialize_state(self, imbalance: int = 4, links_per_replica: int = 200_000):
        self.imbalance = imbalance  # ongoing requests more than the idlest replica
        self.capacity = links_per_replica
        self.seen: dict[ReplicaID, OrderedDict] = {}

    @staticmethod
    def chain_of(request: PendingRequest | None) -> tuple[int, ...]:
        if request is None or not request.args:
            return ()
        return tuple(getattr(request.args[0], "chain", ()) or ())

    def queue_len(self, replica) -> int:
        return self.replica_queue_len_cache.get(replica.replica_id) or 0

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        if not candidate_replicas:
            return []
        two = random.sample(candidate_replicas, min(2, len(candidate_replicas)))
        chain = self.chain_of(pending_request)
        best, depth = None, 0
        for r in candidate_replicas:
            d = matched_links(chain, self.seen.get(r.replica_id, ()))
            if d > depth:
                best, depth = r, d
        if best is None:
            return [two]
        idlest = min(self.queue_len(r) for r in candidate_replicas)
        if self.queue_len(best) - idlest > self.imbalance:
            return [two]
        return [[best], [r for r in two if r is not best] or two]

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        chain = self.chain_of(pending_request)
        if not chain:
            return
        seen = self.seen.setdefault(replica_id, OrderedDict())
        for link in chain:
            seen[link] = None
            seen.move_to_end(link)
        while len(seen) > self.capacity:
            seen.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.seen.pop(replica_id, None)

    def update_replicas(self, replicas) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        for rid in [k for k in self.seen if k not in live]:
            del self.seen[rid]
