"""The scheduler: what the engine thread does each step with the model it loaded.

It owns the model's KV block pool (kv_slots.py) and the batch arrays, and schedules only:
1. admits waiting jobs into free slots while the pool has room: the job goes to the free
   slot whose cells share the most with its prompt (or the least recently used one); if
   the radix tree of cached blocks or the RAM cache holds more of it, those blocks are
   referenced (or copied back) instead; only the rest of the prompt is prefilled
   (llama-server's cache_prompt, SGLang's radix cache);
2. builds ONE batch: the last sampled token of every decoding slot and its draft, then
   prompt chunks of the prefilling slots up to a token budget, so decoders are never starved
   by a long prompt; a sequence that cannot grow is preempted and resumed later;
3. runs one `Transformer.forward` (weights read once for all sequences) and gives each
   sequence its logit rows: its `SequenceDecoder` (edgeinfer/decoder.py, the code `run`
   uses too) samples, checks drafts, stops and times; the scheduler sends the job its
   events and keeps the cells the decoder used.

Sequences join and leave the batch at token boundaries. Every row of the batch is computed
independently (activations are quantized per row), so a greedy sequence gives the same tokens
alone or batched.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import replace

import numpy as np

from edgeinfer.decoder import Finish, ProbsRequest, SequenceDecoder
from edgeinfer.errors import ModelFault
from edgeinfer.kv.prefix import common_prefix
from edgeinfer.sampling import make_sampler
from edgeinfer.server.errors import CANCELLED, SHUTTING_DOWN, ApiError
from edgeinfer.server.events import ErrorEvent, FinalEvent, Job, ProgressEvent, TokenEvent
from edgeinfer.server.kv_slots import ServerKV
from edgeinfer.server.options import ServerSettings
from edgeinfer.server.slots import Slot, Stats
from edgeinfer.spec.speculation import Speculation
from edgeinfer.tiles import TILE

log = logging.getLogger("edgeinfer.server")
SIMILARITY = 0.10  # llama-server's --slot-prompt-similarity: below it, prefer an LRU slot


class Scheduler:
    """One loaded model's batch over the engine's slots. `slots`, `stats` and `waiting` are
    the engine's (they outlive a sleeping model); the rest is made here, once."""

    def __init__(self, model, settings: ServerSettings, slots: list[Slot], stats: Stats,
                 waiting: deque[Job]):
        self.model, self.settings = model, settings
        self.slots, self.stats, self.waiting = slots, stats, waiting
        self.n_slots = len(slots)
        tf = model.transformer
        self.n_ctx = tf.n_ctx
        self.kv = ServerKV(tf.kv_cache, self.n_slots, max(0, settings.cache_ram_mib) << 20)
        # speculative decoding: a slot's rows are its last token and a draft, at most
        spec = settings.spec
        self.draft = model.draft_model(spec, settings.threads)
        self.spec_rows = 1 + min(spec.n_max, tf.n_batch - 1) if spec.enabled else 1
        n_rows = self.n_slots * self.spec_rows  # (np.zeros is touched only as rows are used)
        self.logits = np.zeros((n_rows, model.config.n_vocab), np.float32)
        size = tf.n_batch + n_rows
        self.batch_tokens, self.batch_pos, self.batch_slots = (
            np.zeros(size, np.int32) for _ in range(3))
        self.batch_rows = np.zeros(n_rows, np.int32)
        if spec.enabled:
            log.info("speculative decoding: %s, drafts of up to %d tokens%s", spec.type,
                     self.spec_rows - 1, f" from {spec.draft_model}" if self.draft else "")

    def busy(self) -> bool:
        return bool(self.waiting) or any(s.job is not None for s in self.slots)

    def step(self) -> None:
        """Admit what fits, build one batch, run one forward, hand each sequence its rows."""
        self._admit()
        rows = self._build_batch()
        if rows is None:
            return
        n, m, owners, prefilled = rows
        self.stats.kv_cells_peak = max(self.stats.kv_cells_peak, self.kv.used_cells())
        tf = self.model.transformer
        tf.forward(self.batch_tokens[:n], self.batch_pos[:n], self.batch_slots[:n],
                   self.batch_rows[:m], self.logits[:m])
        for slot in prefilled:
            self.kv.commit(slot.id, slot.cache)  # its full blocks can be shared from now
            if slot.next_token < 0:  # not a preempted sequence catching up
                self._progress(slot)
        self.stats.n_decode += 1
        self.stats.busy_slots_sum += sum(s.job is not None for s in self.slots)
        now = time.perf_counter()
        i = 0
        for slot in owners:  # a slot's rows: its last token's, then its draft's
            k = 1 + len(slot.draft)
            try:
                self._on_logits(slot, self.logits[i : i + k], now)
            except ModelFault as exc:  # NaN logits: this request fails, the batch goes on
                log.error("slot %d: task %d failed: %s", slot.id, slot.job.id, exc)
                self._fail(slot, ApiError(500, str(exc)))
            i += k

    # -- admission -----------------------------------------------------------------------------
    def drop_cancelled(self) -> None:
        """Forget cancelled jobs; each still gets a last event, so no reader waits forever."""
        if any(job.cancelled for job in self.waiting):
            for job in self.waiting:
                if job.cancelled:
                    job.sink(ErrorEvent(CANCELLED))
            kept = [job for job in self.waiting if not job.cancelled]
            self.waiting.clear()
            self.waiting.extend(kept)
        for slot in self.slots:
            if slot.job is not None and slot.job.cancelled:
                log.info("slot %d: task %d cancelled after %d tokens", slot.id, slot.job.id,
                         slot.n_decoded)
                slot.job.sink(ErrorEvent(CANCELLED))
                self._release(slot)

    def refuse_for_shutdown(self, running_too: bool) -> None:
        """Refuse (503) the waiting jobs, and the running ones too if asked."""
        for job in self.waiting:
            job.sink(ErrorEvent(SHUTTING_DOWN))
        self.waiting.clear()
        if running_too:
            for slot in self.slots:
                if slot.job is not None:
                    log.info("slot %d: task %d ended by the shutdown after %d tokens", slot.id,
                             slot.job.id, slot.n_decoded)
                    self._fail(slot, SHUTTING_DOWN)

    def _admit(self) -> None:
        for slot in sorted((s for s in self.slots if s.stalled), key=lambda s: s.t_start):
            if not self._resume(slot):
                return  # the oldest preempted sequences first; new jobs wait behind them
        kept: deque[Job] = deque()
        while self.waiting:
            job = self.waiting.popleft()
            slot = None if self._shares_a_prefill(job) else self._choose_slot(job)
            if slot is None:
                kept.append(job)
                continue
            try:
                started = self._start(slot, job)
            except ApiError as exc:  # can never fit
                job.sink(ErrorEvent(exc))
                continue
            except Exception as exc:  # a bug: answer this job, keep serving the others
                log.exception("starting task %d failed", job.id)
                slot.job, slot.cache = None, []
                self.kv.release(slot.id)
                job.sink(ErrorEvent(ApiError(500, f"internal error: {exc}")))
                continue
            if not started:  # no KV room now: it and the jobs behind it wait (FIFO)
                kept.append(job)
                kept.extend(self.waiting)
                self.waiting.clear()
                break
            self._cache_idle_slots()
        self.waiting.extend(kept)

    def _shares_a_prefill(self, job: Job) -> bool:
        """Whether a sequence being prefilled will soon hold a block or more of job's
        prompt: the job then waits to reference those blocks instead of computing them
        again (eight clients with one system prompt compute it once)."""
        if not job.params.cache_prompt:
            return False
        for slot in self.slots:
            if slot.prefilling and slot.n_decoded == 0:
                shared = common_prefix(slot.target, job.prompt)
                ready = min(len(slot.target), self.kv.blocks(shared) * self.kv.block)
                if shared >= self.kv.block and len(slot.cache) < ready:
                    return True
        return False

    def _cache_idle_slots(self) -> None:
        """With a unified KV budget (--kv-unified), idle slots' KV moves to the RAM cache
        when a task starts, freeing their cells (llama-server's --cache-idle-slots)."""
        opts = self.settings
        if not (opts.kv_unified and opts.cache_idle_slots and opts.cache_ram_mib > 0):
            return
        for slot in self.slots:
            if slot.job is None and slot.cache:
                if self.kv.saved.save(slot.id, slot.cache):
                    log.debug("slot %d: idle slot saved to the RAM cache "
                              "(__TEST_TAG_CACHE_IDLE_SLOT__)", slot.id)
                self.kv.release(slot.id, slot.cache)
                slot.cache = []

    def _choose_slot(self, job: Job) -> Slot | None:
        free = [s for s in self.slots if s.job is None]
        if job.params.id_slot >= 0:
            pinned = self.slots[job.params.id_slot]  # checked at the edge
            return pinned if pinned.job is None else None
        if not free:
            return None
        shared = {s.id: common_prefix(s.cache, job.prompt) for s in free}
        best = max(free, key=lambda s: (shared[s.id], -s.last_used))
        if shared[best.id] < SIMILARITY * len(job.prompt):
            best = min(free, key=lambda s: s.last_used)
        return best

    def _start(self, slot: Slot, job: Job) -> bool:
        """Start job in slot if the KV pool has room for its prompt; False: not now."""
        prompt, params = job.prompt, job.params
        # re-evaluate one token to get logits
        if not self._place(slot, prompt, len(prompt) - 1, params.cache_prompt):
            return False
        n_past = len(slot.cache)
        slot.target, slot.stalled = prompt, False
        slot.job, slot.task_id, slot.n_cached, slot.params = job, job.id, n_past, params
        slot.n_prompt = len(prompt)
        slot.next_token, slot.has_new_line, slot.draft = -1, False, []
        slot.t_start = time.perf_counter()
        probs = ProbsRequest(params.n_probs, params.post_sampling_probs) \
            if params.logprobs else None
        slot.decoder = SequenceDecoder(
            self.model.tokenizer, prompt, make_sampler(params.sampling, params.logit_bias),
            self.n_ctx, n_predict=params.n_predict, stop=params.stop,
            constraint=job.constraint, prefill=params.prefill, lazy=params.lazy,
            speculation=self._speculation(slot, job), probs=probs,
            preserved=params.preserved, ignore_eos=params.ignore_eos, n_cached=n_past,
            now=slot.t_start, name=f"task {job.id}")
        log.info("slot %d: task %d, %d prompt tokens, %d cached", slot.id, job.id,
                 len(prompt), n_past)
        self._progress(slot)  # 0 %: what the cache holds
        return True

    def _speculation(self, slot: Slot, job: Job) -> Speculation | None:
        """The job's speculation: the server's --spec-* with its speculative.* fields."""
        spec, params = self.settings.spec, job.params
        if not spec.enabled:
            return None
        spec = replace(spec, n_max=_given(params.spec_n_max, spec.n_max),
                       n_min=_given(params.spec_n_min, spec.n_min),
                       p_min=_given(params.spec_p_min, spec.p_min))
        return Speculation.start(spec, job.prompt, self.spec_rows, self.draft, slot.id)

    def _progress(self, slot: Slot) -> None:
        params = slot.job.params
        if params.stream and params.return_progress:
            decoder = slot.decoder  # the prompt's clock until it is done
            decoder.prompt_progress(len(slot.cache), time.perf_counter())
            timings = decoder.timings.as_dict() if params.timings_per_token else None
            slot.job.sink(ProgressEvent(len(slot.job.prompt), slot.n_cached, len(slot.cache),
                                        decoder.timings.prompt_ms, slot.id, timings))

    # -- KV blocks -----------------------------------------------------------------------------
    def _place(self, slot: Slot, tokens: list[int], n_keep: int, reuse: bool,
               tries: int = 1) -> bool:
        """Give slot the KV cells of tokens' longest cached prefix (at most n_keep of them)
        and blocks for the rest and one more token; slot.cache then lists the cells it holds.
        False if the pool has no room now; an ApiError if it never will."""
        kv, n_tokens = self.kv, len(tokens) + 1
        if kv.blocks(n_tokens) > kv.pool.n_blocks:
            raise ApiError(400, f"the request needs {n_tokens} KV cells "
                           f"({kv.blocks(n_tokens)} blocks of {kv.block}) and the server's "
                           f"KV pool holds {kv.n_cells} cells (-c)")
        others = [(s.id, s.cache) for s in self.slots if s is not slot and s.cache]
        start, match, entry = kv.plan(slot.id, slot.cache, tokens, n_keep, reuse, others)
        slot.cache = slot.cache[: kv.prepare(slot.id, slot.cache, start, entry)]
        if not self._room(kv.blocks_needed(slot.id, start, match, n_tokens), slot):
            if match is not None:
                match.release(kv.pool)
            # what it would reuse can itself take the room it needs (a partly matching
            # block is held while copied); with nobody running, nothing would free it:
            # look again (the idle slots' blocks are back now), then start from scratch,
            # which fits once every other block is given back
            if reuse and not any(s.job is not None and s is not slot for s in self.slots):
                return self._place(slot, tokens, n_keep, tries > 0, tries - 1)
            return False
        kv.begin(slot.id, start, match, entry, n_tokens)
        slot.cache = list(tokens[: start.n_past])
        return True

    def _room(self, need: int, keep: Slot) -> bool:
        """Make need blocks available, taking idle slots' blocks (least recently used
        first; their sequences go to the RAM cache) but not keep's."""
        while self.kv.pool.n_available < need:
            if not self._reclaim_idle(keep):
                return False
        return True

    def _reclaim_idle(self, keep: Slot) -> bool:
        idle = [s for s in self.slots if s.job is None and s is not keep
                and self.kv.tables[s.id].blocks]
        if not idle:
            return False
        slot = min(idle, key=lambda s: s.last_used)
        self.kv.release(slot.id, slot.cache, save=True)
        slot.cache = []
        return True

    def _grow_decoders(self) -> None:
        """Each decoding sequence gets a block for its next token when it needs one; with
        none left the most recently started sequence is preempted (its blocks go back)."""
        for slot in sorted((s for s in self.slots if s.decoding), key=lambda s: s.t_start):
            while slot.decoding and not self.kv.grow(slot.id, len(slot.cache) + 1):
                if not self._reclaim_idle(slot):
                    running = [s for s in self.slots if s.job is not None and not s.stalled]
                    self._preempt(max(running, key=lambda s: s.t_start))

    def _preempt(self, slot: Slot) -> None:
        log.info("slot %d: task %d preempted after %d tokens: the KV pool is full; it resumes "
                 "when blocks free up", slot.id, slot.job.id, slot.n_decoded)
        self.kv.release(slot.id, slot.cache)  # its full blocks stay cached
        slot.target, slot.cache, slot.stalled = list(slot.cache), [], True
        self.stats.n_preempted += 1

    def _resume(self, slot: Slot) -> bool:
        """Prefill a preempted sequence's cells again (from cached blocks where it can)."""
        if not self._place(slot, slot.target, len(slot.target), True):
            return False
        slot.stalled = False
        log.info("slot %d: task %d resumes, %d of %d cells cached", slot.id, slot.job.id,
                 len(slot.cache), len(slot.target))
        return True

    # -- batching ------------------------------------------------------------------------------
    def _draft(self) -> None:
        """Speculating decoders draft the tokens after their next one, as far as the KV
        pool has room without taking anyone's blocks. Alone, a sequence drafts as `run`
        does; in a batch, every row costs compute, so drafts fill only the rows the
        decoders leave free in the first register tile."""
        n_seqs = sum(slot.decoding for slot in self.slots)
        spare = None if n_seqs == 1 else max(0, TILE - n_seqs)
        for slot in self.slots:
            slot.draft = []
            if not slot.decoding or spare == 0:
                continue
            draft = slot.decoder.propose(spare, n_seqs)
            if draft and self.kv.grow(slot.id, len(slot.cache) + 1 + len(draft)):
                slot.draft = draft
                spare = None if spare is None else spare - len(draft)

    def _build_batch(self) -> tuple[int, int, list[Slot], list[Slot]] | None:
        """Fill the batch arrays; return (n_tokens, n_logits rows, slots owning the
        logits rows in order (1 + len(draft) rows each), slots with prompt tokens in the
        batch)."""
        self._grow_decoders()
        self._draft()
        n, m, owners, prefilled = 0, 0, [], []
        for slot in self.slots:  # decoders first: a token each, and a draft
            if slot.decoding:
                for token in (slot.next_token, *slot.draft):
                    n = self._put(n, token, len(slot.cache), slot.id)
                    slot.cache.append(token)
                    self.batch_rows[m] = n - 1
                    m += 1
                owners.append(slot)
        budget = self._prefill_budget(n)
        for slot in self.slots:
            if not slot.prefilling or budget <= 0:
                continue
            prompt = slot.target
            start = len(slot.cache)
            chunk = prompt[start:start + budget]
            for i, token in enumerate(chunk):
                n = self._put(n, token, start + i, slot.id)
            slot.cache.extend(chunk)
            budget -= len(chunk)
            prefilled.append(slot)
            if len(slot.cache) == len(prompt) and slot.next_token < 0:  # not a resumed one
                self.batch_rows[m] = n - 1
                m += 1
                owners.append(slot)
        return (n, m, owners, prefilled) if n else None

    def _prefill_budget(self, n_decoding: int) -> int:
        """Prompt tokens this step may add: a full batch when nobody is decoding, else a
        quarter of it, so running streams keep a steady pace during a long prefill."""
        n_batch = self.model.transformer.n_batch
        return n_batch if n_decoding == 0 else max(32, n_batch // 4)

    def _put(self, n: int, token: int, pos: int, slot: int) -> int:
        self.batch_tokens[n], self.batch_pos[n], self.batch_slots[n] = token, pos, slot
        return n + 1

    # -- after the forward ---------------------------------------------------------------------
    def _on_logits(self, slot: Slot, rows: np.ndarray, now: float) -> None:
        """rows (1 + len(slot.draft), n_vocab): the logits after slot's next token, then
        after each drafted token; the decoder takes its tokens from them and the cells of a
        rejected draft are dropped."""
        job, decoder = slot.job, slot.decoder
        if slot.next_token < 0:  # the prompt has just been processed
            self.stats.prompt_tokens += len(job.prompt) - slot.n_cached
            self.stats.prompt_cached += slot.n_cached
            self.stats.prompt_seconds += now - slot.t_start
            decoder.prompt_done(now)
        draft, slot.draft = slot.draft, []
        per_token = job.params.timings_per_token
        for out in (decoder.step(rows, draft, now) if decoder.finish is None else ()):
            slot.has_new_line = slot.has_new_line or "\n" in out.text
            timings = decoder.timings.as_dict() if per_token else None
            job.sink(TokenEvent(out.text, out.token, decoder.n_decoded, slot.id, out.probs,
                                timings, slot.n_cached))
        if draft:  # keep the cells up to the last token taken's: its own is fed next step
            n_rows = decoder.rows_used
            slot.cache = slot.cache[: len(slot.cache) - len(draft) - 1 + n_rows]
            self.kv.truncate(slot.id, len(slot.cache))
            self.stats.draft_tokens += len(draft)
            self.stats.draft_accepted += decoder.n_accepted
            self.stats.n_drafts += 1
        if decoder.finish is not None:
            return self._finish(slot, decoder.finish)
        slot.next_token = decoder.last_token

    def _finish(self, slot: Slot, finish: Finish) -> None:
        job, decoder = slot.job, slot.decoder
        job.sink(FinalEvent(
            finish.tail, finish.stop_type, finish.word, finish.truncated, slot.id,
            len(job.prompt), slot.n_cached, decoder.n_decoded, len(slot.cache),
            decoder.timings.as_dict()))
        self.stats.requests_done += 1
        self.stats.n_tokens_max = max(self.stats.n_tokens_max, len(slot.cache))
        self._release(slot)

    def _release(self, slot: Slot) -> None:
        decoder = slot.decoder
        if slot.job is not None and decoder is not None and decoder.n_decoded:
            self.stats.predicted_tokens += decoder.n_decoded
            self.stats.predicted_steps += decoder.n_decoded - 1
            self.stats.predicted_seconds += max(1e-6, decoder.t_last - decoder.t_prompt)
        if slot.stalled:  # its cells were given back
            slot.cache, slot.stalled = [], False
        slot.job, slot.next_token, slot.decoder = None, -1, None
        slot.last_used = time.perf_counter()
        self.kv.commit(slot.id, slot.cache)  # it keeps its blocks until they are needed

    def _fail(self, slot: Slot, error: ApiError) -> None:
        """End the slot's job with an error; its KV cells are not trusted again."""
        slot.job.sink(ErrorEvent(error))
        self.kv.release(slot.id)
        slot.cache = []
        self._release(slot)

    def fail_all(self, error: ApiError) -> None:
        for slot in self.slots:
            if slot.job is not None:
                self._fail(slot, error)


def _given(value, default):
    """A request's value, or the server's where it gave none (-1)."""
    return default if value < 0 else value
