"""Continuous batching over one `Engine`: one background thread owns the device.

Data flow. `submit()` (any thread) validates a tokenized prompt, appends it to a bounded waiting
queue and wakes the engine thread. The engine thread repeats:

1. apply cancellations (a cancelled request frees its slot at once);
2. admit waiting requests into idle slots (FIFO). Paged engines (the default): any idle slot; the
   request's longest cached prefix is matched by `BlockCache.begin` when its prefill starts, so a
   prompt admitted while another computes the same system prompt reuses it, whichever slot computed
   it (g4bench/engine/block_cache.py). Contiguous engines: `SlotTable.plan` continues a resident
   conversation, copies a shared prefix from another slot (`engine.copy_slot`), or starts cold in
   an empty / least recently used slot;
3. one `engine.decode` over every decoding slot (one token each);
4. at most one prefill chunk (`engine.ecfg.chunk_size` tokens) for the oldest admitted prompt, so an
   arrival stalls the running streams by one chunk at most. The last chunk samples the request's
   first token. (Paged: if the pools lack blocks for the whole request even after evicting every
   cached block, the prompt waits at the head until running requests finish.)

Steps 3 and 4 are the "chunk" policy. With speculative decoding (`spec`, serve --draft-model
--spec-k) step 3 is a speculative round instead: draft k tokens per request, verify them in one
target call, deliver the accepted ones (g4bench/engine/spec_turn.py). The "mixed" policy (the
default when paged, `EngineConfig.policy`) folds them into one `engine.step` call: every decoding
slot's token plus prefill chunks of as many admitted prompts as fit the token budget
(`max_batched_tokens`), so a burst prefills together and a running stream waits at most one
budgeted call (g4bench/engine/mixed_turn.py).

With nothing to do it sleeps on a condition variable. Every sampled token goes to the request's
`RequestSink.on_token` (in the engine thread; the server turns it into text and hands it to
asyncio). A request stops on an EOS / stop id (unless `ignore_eos`), when its sink reports a
completed stop string, or at `max_tokens`.

`min_tokens` (vLLM's meaning: no EOS among the first `min_tokens` output tokens): a request with
`min_tokens > 0` starts with the engine's EOS ban on (`SamplingParams.suppress_eos`, which already
applies to the token sampled at the end of prefill); once `min_tokens` tokens exist the scheduler
lifts it with one `engine.set_suppress_eos(slot, False)` (a tiny device update, done once, and only
if the request goes on). Stop ids that are not engine EOS ids (a chat template's end-of-turn id)
and stop strings cannot be banned; they count only once more than `min_tokens` tokens exist.
The token that ends a request is never fed back, so a slot's recorded tokens are exactly those
whose K/V the engine wrote, and a finished conversation stays resident for the next turn.

Grammars and logprobs (`GenerationParams.constraint`, `.logprobs`). A decode batch in which no
request has either runs the fused `engine.decode` (the sampler inside the step): such requests pay
nothing. Otherwise the constrained slots' matchers consume the tokens about to be fed (a token a
matcher refuses, a sampler bug, fails that request only) and `AgentStep` (agent_step.py) runs the
split step: masks on a worker thread while the forward runs, masked sampling, logprob rows. A
request's first token is re-sampled under its first mask by `AgentStep.first_token`. Prefix reuse
and chunked prefill are untouched: the grammar only sees generated tokens.

Failures: an exception from `prefill`/`copy_slot` or a sink fails that request; one from `decode`
fails the requests in that step (their slots are wiped); the loop keeps running. Anything else
(including a BaseException such as SystemExit raised inside the engine) is a scheduler bug: the
loop dies, logs it loudly, fails every request, and `alive` turns False (the server's /health then
answers 503).

Liveness: the engine thread sets `heartbeat` (time.monotonic()) at every loop turn and at least
every `HEARTBEAT_S` while idle, so a watcher can tell a stalled engine (a device call that never
returns) from an idle one: `time.monotonic() - heartbeat` grows only while the thread is stuck.

Admission bound: `submit` refuses (QueueFull) only when the requests waiting would exceed
`max_waiting` plus the slots that are idle right now, so `max_waiting=0` still admits into an idle
slot and a burst is never refused while slots sit empty.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from g4bench.engine.agent_step import AgentStep
from g4bench.engine.block_cache import BlockCache
from g4bench.engine.grammar import TokenConstraint
from g4bench.engine.logprobs import TokenLogprob
from g4bench.engine.mixed_turn import MixedTurn
from g4bench.engine.prefix_cache import SlotTable
from g4bench.engine.sampling import SamplingParams
from g4bench.engine.spec_batch import SpecDecoder
from g4bench.engine.spec_turn import SpecTurn

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.25  # the idle engine thread's heartbeat period


@dataclass(frozen=True)
class GenerationParams:
    """Everything about one request besides its prompt."""

    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] | None = None  # None: the engine's eos_token_ids
    # This request's grammar state (a fresh matcher per request; the scheduler advances it).
    constraint: TokenConstraint | None = field(default=None, compare=False)
    logprobs: int | None = None  # None: none; k >= 0: the chosen token's logprob and the top k


@dataclass
class RequestResult:
    """What happened to one request; times in seconds from submission (perf_counter)."""

    request_id: int
    finish_reason: str  # "stop" | "length" | "cancelled" | "error"
    prompt_tokens: int
    cached_tokens: int  # prompt tokens reused from a slot (not computed)
    computed_tokens: int  # prompt tokens prefilled (fewer than prompt - cached if cancelled early)
    output_ids: list[int]
    queue_s: float | None  # submission -> admission to a slot
    ttft_s: float | None  # submission -> first token sampled
    token_times_s: list[float]  # one per output token
    error: str | None = None


class RequestSink(Protocol):
    """Receives one request's tokens; called in the engine thread, so it must be quick."""

    def on_token(self, token: int, logprob: TokenLogprob | None = None) -> bool:
        """Take one sampled token (with its logprob row when the request asked for logprobs);
        return True when a stop string has just been completed."""
        ...

    def on_finish(self, result: RequestResult) -> None: ...


class SchedulerObserver(Protocol):
    def on_step(self, active: int, slots: int) -> None: ...

    def on_finish(self, result: RequestResult) -> None: ...


class QueueFull(RuntimeError):
    """The waiting queue is at its bound; the client should retry later."""


class SchedulerDead(RuntimeError):
    """The engine loop has stopped (a bug or shutdown); no request can run."""


@dataclass(eq=False)
class _Request:
    id: int
    prompt: list[int]
    params: GenerationParams
    sink: RequestSink
    submitted: float
    stop_ids: frozenset[int]
    slot: int | None = None
    prefilled: int = 0  # prompt tokens whose K/V are in the slot
    reused: int = 0
    placed: bool = False  # paged: BlockCache.begin() has matched its prefix and reserved its blocks
    admitted: float | None = None
    next_token: int | None = None  # sampled, to be fed by the next decode step
    suppressing: bool = False  # the engine's EOS ban is on for this request's slot (min_tokens)
    output: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)


class Scheduler(MixedTurn, SpecTurn):
    """Owns an engine and its slots; see the module docstring for the loop."""

    def __init__(
        self,
        engine,
        *,
        max_waiting: int = 64,
        copy_min: int = 16,
        warmup: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        spec: SpecDecoder | None = None,
    ) -> None:
        self.engine = engine
        self.spec = spec  # speculative decoding (spec_turn.py); None: plain decode
        self.clock = clock  # request times; the simulator passes a virtual clock (harness/sim)
        self.max_slots: int = engine.ecfg.max_slots
        self.max_len: int = engine.ecfg.max_len
        self.chunk_size: int = engine.ecfg.chunk_size
        self.vocab_size: int = engine.cfg.vocab_size
        self.max_waiting = max_waiting
        layout = getattr(engine, "layout", None)
        self.paged = bool(getattr(layout, "paged", False))
        self.table: SlotTable | BlockCache
        if self.paged:
            assert layout is not None  # getattr(None, "paged", False) is False
            self.table = BlockCache(
                self.max_slots,
                block_size=layout.block_size,
                table_len=layout.table_len,
                full_blocks=layout.blocks,
                window_blocks=layout.window_blocks,
                window=engine.cfg.sliding_window,
                set_table=engine.set_block_table,
            )
        else:
            self.table = SlotTable(self.max_slots, copy_min=copy_min)
        self.agent = AgentStep(engine, self.max_slots, self.vocab_size)  # grammars and logprobs
        ecfg = engine.ecfg
        self.mixed = self.paged and getattr(ecfg, "policy", "chunk") == "mixed"
        if spec is not None and self.mixed:
            raise ValueError("speculative decoding runs the chunk prefill policy (prefill_policy='chunk')")
        self.max_batched_tokens: int = getattr(ecfg, "max_batched_tokens", self.chunk_size)
        self.observers: list[SchedulerObserver] = []
        self.warmup_s: float | None = None
        self.steps = 0
        self._do_warmup = warmup
        self._cv = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._cancels: set[int] = set()
        self._stopping = False
        self._next_id = 0
        self._running: dict[int, _Request] = {}  # engine thread only
        self._prefilling: deque[_Request] = deque()  # engine thread only, admission order
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.heartbeat = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="g4bench-engine", daemon=True)

    # ---- any thread -------------------------------------------------------------------------
    def start(self) -> Scheduler:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def ready(self) -> bool:
        """Warm-up done and the loop running."""
        return self._ready.is_set() and self.alive

    @property
    def alive(self) -> bool:
        return self._error is None and self._thread.is_alive()

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def num_active(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def wait_ready(self, timeout: float) -> bool:
        """Block until warm-up is done (True) or the loop died / the timeout passed (False)."""
        return self._ready.wait(timeout) and self.alive

    def submit(self, prompt: list[int], params: GenerationParams, sink: RequestSink) -> int:
        """Queue a request; returns its id. Raises ValueError, QueueFull or SchedulerDead."""
        self._validate(prompt, params)
        stop_ids = params.stop_token_ids if params.stop_token_ids is not None else self.engine.eos_token_ids
        with self._cv:
            if self._error is not None or self._stopping:
                raise SchedulerDead(f"engine loop is not running: {self._error!r}")
            idle = max(0, self.max_slots - len(self._running))
            if len(self._waiting) >= self.max_waiting + idle:
                raise QueueFull(f"{len(self._waiting)} requests already waiting (limit {self.max_waiting})")
            rid = self._next_id
            self._next_id += 1
            req = _Request(rid, list(prompt), params, sink, self.clock(), frozenset(stop_ids))
            self._waiting.append(req)
            self._cv.notify_all()
        return rid

    def is_waiting(self, request_id: int) -> bool:
        """Whether the request is still queued for a slot (not admitted, not finished)."""
        with self._cv:
            return any(r.id == request_id for r in self._waiting)

    def cancel(self, request_id: int) -> None:
        """Stop a request (waiting or running) and free its slot; unknown or finished ids are ignored."""
        with self._cv:
            self._cancels.add(request_id)
            self._cv.notify_all()

    def _validate(self, prompt: list[int], params: GenerationParams) -> None:
        if not prompt:
            raise ValueError("the prompt has no tokens")
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
        if not 0 <= params.min_tokens <= params.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {params.min_tokens}")
        if len(prompt) + params.max_tokens > self.max_len:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                f"the context length {self.max_len}"
            )
        ids = np.asarray(prompt)
        if ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError(f"prompt token ids must be integers in [0, {self.vocab_size})")

    # ---- engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self._do_warmup:
                self.warmup_s = self.engine.warmup() + (self.spec.warmup() if self.spec else 0.0)
                log.info("engine warm-up done in %.1f s", self.warmup_s)
            self._ready.set()
            while self._wait_for_work():
                self.heartbeat = time.monotonic()
                self.step()
        except BaseException as exc:  # a scheduler bug (or SystemExit in the engine): fail loudly
            log.exception("g4bench engine loop died; every request fails until restart")
            self._error = exc
            self._ready.set()  # wake wait_ready(); `ready` stays False because the loop is dead
        self.agent.close()
        try:
            self._fail_everything("engine loop died" if self._error else "server shutting down")
        except Exception:
            log.exception("failing the remaining requests failed")

    def step(self) -> None:
        """One loop turn: cancellations, admission, then one mixed engine call (mixed policy) or one
        decode step and at most one prefill chunk (chunk policy). The engine thread calls it; the
        simulator (harness/sim) calls it directly, without the thread, to drive this exact loop on
        a virtual clock."""
        self._apply_cancels()
        self._admit()
        if self.mixed:
            self._mixed_step()
            return
        if self.spec is not None:
            self._spec_step()
        else:
            self._decode_step()
        self._prefill_step()

    def _wait_for_work(self) -> bool:
        with self._cv:
            while not (self._stopping or self._waiting or self._running or self._cancels):
                self.heartbeat = time.monotonic()
                self._cv.wait(HEARTBEAT_S)
            return not self._stopping

    def _apply_cancels(self) -> None:
        with self._cv:
            cancels, self._cancels = self._cancels, set()
            dropped = [r for r in self._waiting if r.id in cancels]
            for r in dropped:
                self._waiting.remove(r)
        for r in dropped:
            self._finish(r, "cancelled")
        for rid in cancels:
            if rid in self._running:
                self._finish(self._running[rid], "cancelled")

    def _admit(self) -> None:
        if self.paged:
            self._admit_paged()
            return
        table = self.table
        assert isinstance(table, SlotTable)  # not paged
        while table.idle():
            with self._cv:  # only this thread removes from the queue: peek, place, then pop
                if not self._waiting:
                    return
                req = self._waiting[0]
            plan = table.plan(req.prompt, self.engine.can_resume)
            assert plan is not None  # an idle slot exists
            with self._cv:
                self._waiting.popleft()
            table.acquire(plan, req.id)
            req.slot, req.prefilled, req.reused = plan.slot, plan.reuse, plan.reuse
            req.admitted = self.clock()
            self._running[req.id] = req
            if plan.copy_from is not None:
                try:
                    self.engine.copy_slot(plan.copy_from, plan.slot)
                except Exception as exc:
                    log.exception(
                        "copy_slot(%d, %d) failed for request %d", plan.copy_from, plan.slot, req.id
                    )
                    self._finish(req, "error", error=f"copy_slot failed: {exc}", keep=False)
                    continue
            self._prefilling.append(req)

    def _admit_paged(self) -> None:
        """Paged: a request only needs a slot now; its prefix is matched when its prefill starts."""
        table = self.table
        assert isinstance(table, BlockCache)  # paged
        while True:
            with self._cv:
                if not self._waiting:
                    return
                slot = table.claim(self._waiting[0].id)
                if slot is None:
                    return
                req = self._waiting.popleft()
            req.slot, req.admitted = slot, self.clock()
            self._running[req.id] = req
            self._prefilling.append(req)

    def _decode_step(self) -> None:
        batch, split = self._decode_batch()
        if batch:
            self._run_decode(batch, split)

    def _run_decode(self, batch: list[_Request], split: bool) -> None:
        """One decode call over `batch`; an exception fails the requests in it."""
        try:
            tokens, positions, active = self._decode_inputs(batch)
            if split:
                out, rows, _ = self.agent.decode(tokens, positions, active, self._wanted_logprobs(batch))
            else:
                out, rows = np.asarray(self.engine.decode(tokens, positions, active)), {}
        except Exception as exc:
            log.exception("decode step failed; failing its %d requests", len(batch))
            for r in batch:
                self._finish(r, "error", error=f"decode failed: {exc}", keep=False)
            return
        self._deliver_decode(batch, out, rows)

    def _decode_batch(self) -> tuple[list[_Request], bool]:
        """The requests with a token to feed, and whether the step must be split (a grammar or
        logprobs among them; their matchers have then consumed the token: refused ones are failed)."""
        batch = [r for r in self._running.values() if r.next_token is not None]
        split = any(r.params.constraint is not None or r.params.logprobs is not None for r in batch)
        if split:
            batch = self._advance_constraints(batch)
        return batch, split

    def _decode_inputs(self, batch: list[_Request]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, positions, active) [max_slots] for a decode over `batch`; paged: blocks held."""
        tokens = np.zeros(self.max_slots, np.int32)
        positions = np.zeros(self.max_slots, np.int32)
        active = np.zeros(self.max_slots, bool)
        for r in batch:
            assert r.slot is not None and r.next_token is not None  # admitted, token pending
            tokens[r.slot] = r.next_token
            positions[r.slot] = len(self.table.slots[r.slot].tokens)
            active[r.slot] = True
            if self.paged:
                assert isinstance(self.table, BlockCache)
                self.table.prepare(r.slot, int(positions[r.slot]), 1)
        return tokens, positions, active

    @staticmethod
    def _wanted_logprobs(batch: list[_Request]) -> dict[int, int]:
        return {
            r.slot: r.params.logprobs for r in batch if r.slot is not None and r.params.logprobs is not None
        }

    def _deliver_decode(self, batch: list[_Request], out: np.ndarray, rows: dict[int, TokenLogprob]) -> None:
        """Record the fed tokens and hand each request its sampled one."""
        self.steps += 1
        self._notify("on_step", len(batch), self.max_slots)
        now = self.clock()
        for r in batch:
            assert r.slot is not None and r.next_token is not None
            self.table.extend(r.slot, [r.next_token])
            r.next_token = None
            self._deliver(r, int(out[r.slot]), now, rows.get(r.slot))

    def _advance_constraints(self, batch: list[_Request]) -> list[_Request]:
        """Constrained requests' matchers consume the token about to be fed; a refused token fails
        its request (returns the batch without it)."""
        kept = []
        for r in batch:
            if r.params.constraint is not None:
                assert r.next_token is not None
                try:
                    r.params.constraint.advance(r.next_token)
                except Exception as exc:
                    log.exception("grammar refused token %d of request %d", r.next_token, r.id)
                    self._finish(r, "error", error=f"grammar violation: {exc}")
                    continue
            kept.append(r)
        return kept

    def _prefill_step(self) -> None:
        if not self._prefilling:
            return
        req = self._prefilling[0]
        assert req.slot is not None  # admitted
        if self.paged and not req.placed:
            assert isinstance(self.table, BlockCache)
            reuse = self.table.begin(req.slot, req.prompt, req.params.max_tokens)
            if reuse is None:
                return  # not enough free or evictable blocks yet: running requests will free some
            req.placed, req.prefilled, req.reused = True, reuse, reuse
        slot = self.table.slots[req.slot]
        assert len(slot.tokens) == req.prefilled, "slot tokens out of step with the prefill cursor"
        chunk = req.prompt[req.prefilled : req.prefilled + self.chunk_size]
        last = req.prefilled + len(chunk) == len(req.prompt)
        sampling = None
        if last:
            req.suppressing = req.params.min_tokens > 0
            sampling = replace(req.params.sampling, suppress_eos=req.suppressing)
        try:
            if self.paged:
                assert isinstance(self.table, BlockCache)
                self.table.prepare(req.slot, req.prefilled, len(chunk))
            tok = self.engine.prefill(req.slot, chunk, req.prefilled, sampling)
            row = None
            if last and (req.params.constraint is not None or req.params.logprobs is not None):
                position = req.prefilled + len(chunk) - 1
                p = req.params
                tok, row = self.agent.first_token(req.slot, position, int(tok), p.constraint, p.logprobs)
        except Exception as exc:
            log.exception("prefill failed for request %d", req.id)
            self._finish(req, "error", error=f"prefill failed: {exc}", keep=False)
            return
        self.table.extend(req.slot, chunk)
        req.prefilled += len(chunk)
        if last:
            self._prefilling.popleft()
            self._deliver(req, int(tok), self.clock(), row)

    def _deliver(self, req: _Request, token: int, now: float, row: TokenLogprob | None = None) -> None:
        """Hand one sampled token to the request and decide whether it ends there."""
        req.output.append(token)
        req.times.append(now - req.submitted)
        try:
            stop_string = req.sink.on_token(token) if row is None else req.sink.on_token(token, row)
        except Exception as exc:
            log.exception("sink of request %d failed", req.id)
            self._finish(req, "error", error=f"output handling failed: {exc}")
            return
        p = req.params
        past_min = len(req.output) > p.min_tokens
        if past_min and ((token in req.stop_ids and not p.ignore_eos) or stop_string):
            self._finish(req, "stop")
        elif len(req.output) >= p.max_tokens:
            self._finish(req, "length")
        else:
            if req.suppressing and len(req.output) >= p.min_tokens:
                try:
                    self.engine.set_suppress_eos(req.slot, False)
                except Exception as exc:
                    log.exception("lifting the EOS ban failed for request %d", req.id)
                    self._finish(req, "error", error=f"set_suppress_eos failed: {exc}", keep=False)
                    return
                req.suppressing = False
            req.next_token = token

    def _finish(self, req: _Request, reason: str, error: str | None = None, keep: bool = True) -> None:
        """Free the request's slot at once (its tokens stay resident if `keep`) and report."""
        if req.slot is not None:
            self._running.pop(req.id, None)
            if req in self._prefilling:
                self._prefilling.remove(req)
            self.table.release(req.slot, keep=keep)
            if req.params.constraint is not None:
                self.agent.release(req.slot)
        result = RequestResult(
            request_id=req.id,
            finish_reason=reason,
            prompt_tokens=len(req.prompt),
            cached_tokens=req.reused,
            computed_tokens=req.prefilled - req.reused,
            output_ids=list(req.output),
            queue_s=None if req.admitted is None else req.admitted - req.submitted,
            ttft_s=req.times[0] if req.times else None,
            token_times_s=list(req.times),
            error=error,
        )
        try:
            req.sink.on_finish(result)
        except Exception:
            log.exception("sink of request %d failed in on_finish", req.id)
        self._notify("on_finish", result)

    def _notify(self, hook: str, *args) -> None:
        for obs in self.observers:
            fn = getattr(obs, hook, None)  # observers may implement only some hooks
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception:
                log.exception("scheduler observer %r failed in %s", obs, hook)

    def _fail_everything(self, why: str) -> None:
        with self._cv:
            waiting, self._waiting = list(self._waiting), deque()
        for r in waiting + list(self._running.values()):
            self._finish(r, "error", error=why, keep=False)
