#!/usr/bin/python3
"""Serving under pool pressure: the trained model of eval/model behind a continuous-batching
loop whose K/V live in entrokvd's pool, with four ways to manage a pool too small for the
offered load.

The loop runs in decode steps, so results do not depend on the machine: requests arrive on a
seeded schedule (exponential gaps, `--rate` per step), wait in a first-come queue, are admitted
(their prompt prefilled, up to `--prefill-tokens` prompt tokens per step) and then each step
every running request decodes one token (greedy) until EOS or its answer budget. The pool holds
`share` of the offered uncompressed KV: rate x mean lifetime in steps (1 + the answer budget) x
mean frames of a request (prompt and answer, uncompressed).

Strategies (the names the report uses):
  fcfs         no eviction; the queue's head is admitted when its whole request (prompt and
               answer budget) fits beside what the running requests may still grow to; never
               preempts.
  recompute    no eviction; admitted when its prompt fits (a 1% watermark left); when a decode
               step finds the pool full the newest running request is preempted, closed, and
               recomputed later (vLLM's choice).
  fixed        the worker's fixed budget: page_entrokv keeps `share` of each prompt (fraction),
               decided at prefill; admission and preemption as recompute.
  manager      entrokvd's server-chosen budgets: every sequence is opened with an AutoBudget
               (floor `--floor`); the daemon reclaims from them where pages are worth least,
               delays admissions that do not fit until the owners' next calls, and names the
               sequences to preempt when floors are reached (closed and recomputed). The worker
               asks, in queue order, for up to two steps' prefill at once.
  manager_swap the same, preempted sequences swapped out to host memory and resumed.
  fixed_matched
               fixed at the fraction that gives the manager's mean used frames at the same pool
               share (runs last, after fixed and manager): the comparison at equal memory.

A prompt's prefill does not depend on what is evicted (every layer attends over the whole prompt
before its decision is applied), so each prompt is prefilled once with the plain model and its
K/V, LAST_ROW statistics and last logits are written into the pool at every admission; decoding
runs the model for real through the pool (pool_worker.PoolKV). A recomputed request is
prefilled again, its generated tokens' K/V as first computed (no eviction: the same values a
prefill of prompt and answer gives).

The report (docs/evaluation/pressure/; docs/evaluation.md says how --floor and
--target-occupancy were chosen on development seeds):
  PYTHONPATH=build/client/python /usr/bin/python3 eval/model/serve.py \\
      --entrokvd build/service/entrokvd --entrokv build/client/cli/entrokv \\
      --weights eval/model/weights.npz --requests 200 --seed 7001 --out docs/evaluation/pressure
The main job's short version (deploy/demo.sh): --requests 12 --lengths 1024 --shares 0.25 --short.
"""
from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import itertools
import math
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import policies as policy_registry  # noqa: E402
import pool_worker  # noqa: E402
import tasks  # noqa: E402
from significance import discordant, mcnemar, wilson  # noqa: E402

import entrokv  # noqa: E402  (client/python; PYTHONPATH=<build>/client/python)

STRATEGIES = ("fcfs", "recompute", "fixed", "manager", "manager_swap", "fixed_matched")
POLICY = "page_entrokv"
SUMMARY_FIELDS = ("strategy", "pool_share", "requests", "completed", "accuracy", "ci_low",
                  "ci_high", "completed_per_1k_steps", "steps", "mean_wait_steps",
                  "p99_wait_steps", "max_wait_steps", "preemptions", "swaps", "peak_used_frames",
                  "mean_used_frames", "pool_frames", "mean_kept_share",
                  "mean_final_share", "fixed_fraction")
REQUEST_FIELDS = ("strategy", "pool_share", "request", "task", "length", "arrival", "admitted",
                  "done", "wait_steps", "preemptions", "correct", "kept_frames",
                  "final_frames", "prompt_frames", "final_uncompressed_frames")


# ---- prefill, once per prompt ------------------------------------------------------------------
@dataclasses.dataclass
class Prefill:
    k: np.ndarray  # [layers, kv_heads, tokens, head_dim] float32
    v: np.ndarray
    stats: np.ndarray  # [layers, query_heads, tokens]: LAST_ROW, the statistic page_entrokv wants
    last_logits: np.ndarray  # [vocab]


def prefill_dense(model: numpy_model.Model, prompt: np.ndarray) -> Prefill:
    kv = numpy_model.DenseKV(model.config)
    stats: Dict[int, np.ndarray] = {}

    def keep(layer: int, stat: List[np.ndarray]) -> None:
        stats[layer] = np.concatenate(stat, axis=0)

    logits = model.step(np.asarray(prompt), np.arange(len(prompt)), kv, 1, keep)
    return Prefill(k=np.stack(kv.k), v=np.stack(kv.v),
                   stats=np.stack([stats[l] for l in range(model.config.layers)]),
                   last_logits=logits[-1])


class PrefillCache:
    """Each prompt's prefill, computed once; on disk when `directory` is given (npz per prompt)."""

    def __init__(self, model: numpy_model.Model, directory: Optional[str] = None):
        self.model, self.directory = model, directory
        self._memory: Dict[str, Prefill] = {}
        if directory:
            os.makedirs(directory, exist_ok=True)

    def get(self, key: str, prompt: np.ndarray) -> Prefill:
        if key in self._memory:
            return self._memory[key]
        path = os.path.join(self.directory, f"{key}.npz") if self.directory else None
        if path and os.path.exists(path):
            with np.load(path) as data:
                prefill = Prefill(k=data["k"], v=data["v"], stats=data["stats"],
                                  last_logits=data["last_logits"])
        else:
            prefill = prefill_dense(self.model, prompt)
            if path:
                np.savez(path + ".part.npz", k=prefill.k, v=prefill.v, stats=prefill.stats,
                         last_logits=prefill.last_logits)
                os.replace(path + ".part.npz", path)
        if not self.directory:
            self._memory[key] = prefill
        return prefill


# ---- the workload ------------------------------------------------------------------------------
@dataclasses.dataclass
class Request:
    index: int
    example: tasks.Example
    arrival: int  # step
    max_new: int
    key: str  # the prefill cache's

    @property
    def prompt_len(self) -> int:
        return len(self.example.prompt)


def workload(count: int, rate: float, seed: int, lengths: Sequence[int]) -> List[Request]:
    """`count` requests over the four tasks in turn, lengths drawn from `lengths`, needle depths
    uniform, arrivals a Poisson process of `rate` per step: all from `seed`."""
    rng = np.random.default_rng(seed)
    arrivals = np.floor(np.cumsum(rng.exponential(1.0 / rate, count)) - 1.0 / rate)
    requests = []
    for i in range(count):
        task = tasks.TASKS[i % len(tasks.TASKS)]
        length = int(rng.choice(lengths))
        example_seed = seed * 100_003 + i
        example = tasks.make_example(task, length, example_seed, float(rng.uniform()))
        requests.append(Request(index=i, example=example, arrival=max(0, int(arrivals[i])),
                                max_new=tasks.answer_budget(example),
                                key=f"{task}-{length}-{example_seed}"))
    return requests


def frames_for(tokens: int, page_size: int, layers: int, kv_heads: int) -> int:
    return -(-tokens // page_size) * layers * kv_heads


def offered_frames(requests: Sequence[Request], rate: float, config: numpy_model.Config,
                   page_size: int) -> float:
    """The uncompressed KV the workload keeps in flight (Little's law): rate x mean lifetime
    (prefill step + answer budget) x mean frames of a whole request."""
    lifetime = np.mean([1 + r.max_new for r in requests])
    frames = np.mean([frames_for(r.prompt_len + r.max_new, page_size, config.layers,
                                 config.kv_heads) for r in requests])
    return rate * lifetime * frames


# ---- one run -----------------------------------------------------------------------------------
class RecordingKV(pool_worker.PoolKV):
    """PoolKV that also keeps the K/V of generated tokens (positions past the prompt), so that a
    recomputed request gets them back as a prefill would compute them."""

    def __init__(self, worker, sequence_id: str, length: int, prompt_len: int):
        super().__init__(worker, sequence_id, length)
        self.prompt_len = prompt_len
        self.generated: Dict[int, List[Tuple[np.ndarray, np.ndarray, np.ndarray]]] = \
            collections.defaultdict(list)

    def write(self, layer, positions, k, v) -> None:
        super().write(layer, positions, k, v)
        positions = np.asarray(positions)
        if len(positions) and positions[-1] >= self.prompt_len:
            self.generated[layer].append((positions.copy(), k.copy(), v.copy()))

    def evict(self, rows: np.ndarray) -> None:
        """Rows (layer, group, page) that no longer have a frame: never read again."""
        b = self.worker.page_size
        for layer, group, page in rows:
            self.tables[layer, group, page] = -1
            self.valid[layer, group, page * b:(page + 1) * b] = False


@dataclasses.dataclass
class Running:
    """A request's state in one run."""
    request: Request
    order: int = 0  # admission order: the newest is preempted first
    admitted: Optional[int] = None  # first admission step
    prefilled_at: int = -1  # the step of its latest prefill (it decodes from the next)
    done: Optional[int] = None
    kv: Optional[RecordingKV] = None
    out: List[int] = dataclasses.field(default_factory=list)
    next_token: int = -1
    logits: List[np.ndarray] = dataclasses.field(default_factory=list)
    generated: Dict[int, list] = dataclasses.field(default_factory=dict)  # kept for recompute
    preemptions: int = 0
    swapped: bool = False
    correct: bool = False
    kept_frames: int = 0  # after its first prefill's decisions
    final_frames: int = 0  # when its answer ended (the manager takes pages while it decodes)
    sid: Optional[str] = None  # the sequence id of its current admission (and its retries)


@dataclasses.dataclass
class RunResult:
    strategy: str
    share: float
    pool_frames: int
    steps: int
    states: List[Running]
    used_frames: List[int]  # per step, after it
    preemptions: int
    swaps: int
    unfinished: int
    fraction: Optional[float] = None  # the fixed budget's, for fixed and fixed_matched


class Serving:
    """One strategy on one pool size over one workload, against a daemon. `poison`: after every
    call that can free frames, every frame no open sequence names is overwritten with NaN (the
    safety check of reclaimed frames)."""

    def __init__(self, client: entrokv.Client, model: numpy_model.Model,
                 registry: policy_registry.Registry, cache: PrefillCache, strategy: str,
                 share: float, pool_frames: int, *, floor: float, prefill_tokens: int,
                 fraction: Optional[float] = None, page_size: int = 16, poison: bool = False,
                 max_steps: int = 100_000):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy}")
        self.client, self.model, self.cache = client, model, cache
        self.strategy, self.share, self.pool_frames = strategy, share, pool_frames
        self.fraction = share if fraction is None else fraction  # fixed, fixed_matched
        self.floor, self.prefill_tokens, self.poison = floor, prefill_tokens, poison
        self.max_steps = max_steps
        self.page_size = page_size
        self.worker = pool_worker.PoolWorker(
            client, model, registry, page_size=page_size, capacity_frames=pool_frames,
            model_id=f"serve-{strategy}-{share:g}-{os.getpid()}-{time.monotonic_ns() % 10**9}")
        self.model_id = self.worker.model_id
        c = model.config
        self.frames = lambda tokens: frames_for(tokens, page_size, c.layers, c.kv_heads)
        self._ids = itertools.count()
        self._orders = itertools.count()
        self.preemptions = 0
        self.swaps = 0

    def close(self) -> None:
        self.worker.close(unregister=True)

    # -- the pool ---------------------------------------------------------------------------------
    def _poison(self) -> None:
        if not self.poison:
            return
        used = {int(f) for s in self.client.list_sequences(self.model_id, block_tables=True)
                for t in s.block_tables for f in t.frames if f >= 0}
        free = sorted(set(range(self.pool_frames)) - used)
        self.worker.arena.frames[free] = np.nan

    def _free_frames(self) -> int:
        return self.client.pool_stats(self.model_id).free_frames

    # -- admission --------------------------------------------------------------------------------
    def _open(self, state: Running, step: int) -> None:
        """Opens the request's sequence, writes its prompt's K/V, decides (fixed, manager), and
        for a recomputed request appends and writes its generated tokens. Raises
        ResourceExhaustedError (nothing left open) when the pool says no."""
        request = state.request
        prefill = self.cache.get(request.key, request.example.prompt)
        # A retry keeps the id of the attempt it repeats: the daemon keeps a delayed admission's
        # place (and the frames reclaimed for it) by sequence id. A preempted request comes back
        # under a new one.
        if state.sid is None:
            state.sid = f"r{request.index}-{next(self._ids)}"
        sid = state.sid
        n = request.prompt_len
        auto = self.strategy.startswith("manager")
        _, rows, _ = self.client.open_sequence_frames(
            self.model_id, sid, initial_tokens=n, auto_floor=self.floor if auto else None)
        kv = RecordingKV(self.worker, sid, n, n)
        try:
            kv.assign(rows)
            for layer in range(self.model.config.layers):
                kv.write(layer, np.arange(n), prefill.k[layer], prefill.v[layer])
            if self.strategy.startswith("fixed") or auto:
                budget = {"auto_floor": self.floor} if auto else {"fraction": self.fraction}
                layers = [(layer, prefill.stats[layer]) for layer in range(len(prefill.stats))]
                for decision in self.client.decide_stream(self.model_id, sid, layers,
                                                          policy=POLICY, kind="last_row",
                                                          **budget):
                    kv.evict(np.asarray([(decision.layer, g.group, p) for g in decision.groups
                                         for p in g.evicted_pages], np.int32).reshape(-1, 3))
            if state.out:  # a recomputed request: its generated tokens' K/V back
                appended = self.client.append(self.model_id, sid, len(state.out))
                kv.evict(appended.evicted)
                kv.length = appended.length_tokens
                kv._reserve(kv.length)
                kv.assign(appended.new_frames)
                for layer, writes in state.generated.items():
                    for positions, k, v in writes:
                        kv.write(layer, positions, k, v)
        except BaseException:
            self.client.close_sequence(self.model_id, sid)
            raise
        self._poison()
        state.kv = kv
        state.order = next(self._orders)
        state.prefilled_at = step
        if state.admitted is None:
            state.admitted = step
            state.kept_frames = kv.live_frames()
            state.logits = [prefill.last_logits]
            state.next_token = int(np.argmax(prefill.last_logits))
            self._finish_if_done(state, step)

    def _fits(self, state: Running, running: List[Running]) -> bool:
        """The worker's own admission check (fcfs, recompute, fixed)."""
        request = state.request
        free = self._free_frames()
        if self.strategy == "fcfs":  # the whole request, beside what the others may grow to
            reserved = sum(self.frames(r.request.prompt_len + r.request.max_new)
                           - self.frames(r.kv.length) for r in running)
            return free - reserved >= self.frames(request.prompt_len + request.max_new)
        watermark = math.ceil(0.01 * self.pool_frames)
        return free - watermark >= self.frames(request.prompt_len + len(state.out))

    def _admit(self, state: Running, step: int, running: List[Running]) -> bool:
        if not self.strategy.startswith("manager"):
            if not self._fits(state, running):
                return False
            try:
                self._open(state, step)
            except entrokv.ResourceExhaustedError:
                return False
            return True
        try:
            self._open(state, step)
            return True
        except entrokv.ResourceExhaustedError as error:
            self._preempt_named(error, running)
            return False

    # -- preemption -------------------------------------------------------------------------------
    def _preempt(self, victim: Running, running: List[Running], queue: List[Running],
                 swapped: List[Running]) -> None:
        self.preemptions += 1
        victim.preemptions += 1
        running.remove(victim)
        if self.strategy == "manager_swap":
            self.client.swap_out(self.model_id, victim.kv.sequence_id)
            self.swaps += 1
            victim.swapped = True
            swapped.append(victim)
            swapped.sort(key=lambda s: s.request.index)
        else:
            victim.generated = dict(victim.kv.generated)
            self.client.close_sequence(self.model_id, victim.kv.sequence_id)
            victim.kv = None
            victim.sid = None
            queue.append(victim)
            queue.sort(key=lambda s: s.request.index)
        self._poison()

    def _preempt_named(self, error: entrokv.ResourceExhaustedError,
                       running: List[Running]) -> None:
        """The daemon named sequences to preempt: they are this worker's, so it acts at once."""
        names = set(error.admission.preempt_sequence_ids) if error.admission else set()
        self._named = getattr(self, "_named", set()) | names

    def _resume(self, state: Running, step: int) -> bool:
        try:
            _, rows, _ = self.client.resume(self.model_id, state.kv.sequence_id)
        except entrokv.ResourceExhaustedError as error:
            self._preempt_named(error, [])
            return False
        state.kv.tables[:] = -1
        state.kv.assign(rows)
        state.swapped = False
        state.prefilled_at = step
        state.order = next(self._orders)
        return True

    # -- decoding ---------------------------------------------------------------------------------
    def _finish_if_done(self, state: Running, step: int) -> bool:
        token = state.next_token
        if token != tasks.EOS and len(state.out) < state.request.max_new:
            return False
        state.done = step
        state.final_frames = state.kv.live_frames()
        state.correct = tasks.is_correct(state.request.example, state.out)
        self.client.close_sequence(self.model_id, state.kv.sequence_id)
        self._poison()
        return True

    def _decode(self, state: Running, step: int, running: List[Running], queue: List[Running],
                swapped: List[Running]) -> None:
        kv = state.kv
        while True:
            try:
                appended = self.client.append(self.model_id, kv.sequence_id, 1)
                break
            except entrokv.ResourceExhaustedError as error:
                if self.strategy.startswith("manager"):
                    self._preempt_named(error, running)
                    return  # stalls this step; the owners' calls make room
                # vLLM: preempt the newest running request (this one if it is the newest).
                victim = max(running, key=lambda s: s.order)
                self._preempt(victim, running, queue, swapped)
                if victim is state:
                    return
        kv.evict(appended.evicted)
        self._poison()
        position = kv.length
        kv.length = appended.length_tokens
        kv._reserve(kv.length)
        kv.assign(appended.new_frames)
        token = state.next_token
        state.out.append(token)
        logits = self.model.step(np.array([token]), np.array([position]), kv)[-1]
        state.logits.append(logits)
        state.next_token = int(np.argmax(logits))
        if self._finish_if_done(state, step):
            running.remove(state)
        elif appended.pressure.preempt:
            self._preempt(state, running, queue, swapped)

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, requests: Sequence[Request]) -> RunResult:
        states = [Running(request=r) for r in requests]
        arrivals = sorted(states, key=lambda s: (s.request.arrival, s.request.index))
        queue: List[Running] = []
        running: List[Running] = []
        swapped: List[Running] = []
        used: List[int] = []
        self._named = set()
        step = 0
        next_arrival = 0
        while any(s.done is None for s in states) and step < self.max_steps:
            while next_arrival < len(arrivals) and arrivals[next_arrival].request.arrival <= step:
                queue.append(arrivals[next_arrival])
                next_arrival += 1
            queue.sort(key=lambda s: s.request.index)
            budget = self.prefill_tokens
            # Swapped-out requests are older than anything queued: resumed first.
            while swapped:
                if not self._resume(swapped[0], step):
                    break
                running.append(swapped.pop(0))
            # The worker's own admission stops at the first request that does not fit (first
            # come, first served). The manager asks, in queue order, for up to two steps'
            # prefill: a delayed admission keeps its place (the daemon holds its frames back
            # from newer ones) and every request asked for has its frames planned at the
            # owners' calls of this step, so the next step's prefill finds them free.
            asked = 0
            for head in list(queue) if not swapped else []:
                cost = head.request.prompt_len + len(head.out)
                if cost > budget or asked + cost > 2 * self.prefill_tokens:
                    break
                asked += cost
                if not self._admit(head, step, running):
                    if self.strategy.startswith("manager"):
                        continue
                    break
                budget -= cost
                queue.remove(head)
                if head.done is None:
                    running.append(head)
            for state in sorted(running, key=lambda s: s.order):
                if state in running and state.prefilled_at < step:
                    self._decode(state, step, running, queue, swapped)
            # Sequences the daemon named for an admission that could not wait for them.
            for state in [s for s in running if s.kv.sequence_id in self._named]:
                self._preempt(state, running, queue, swapped)
            self._named = set()
            used.append(self.client.pool_stats(self.model_id).used_frames)
            step += 1
        return RunResult(strategy=self.strategy, share=self.share, pool_frames=self.pool_frames,
                         fraction=self.fraction if self.strategy.startswith("fixed") else None,
                         steps=step, states=states, used_frames=used,
                         preemptions=self.preemptions, swaps=self.swaps,
                         unfinished=sum(s.done is None for s in states))


# ---- the report --------------------------------------------------------------------------------
def summarize(result: RunResult, config: numpy_model.Config,
              page_size: int) -> Dict[str, object]:
    done = [s for s in result.states if s.done is not None]
    waits = np.array([s.admitted - s.request.arrival for s in result.states
                      if s.admitted is not None] or [0])
    correct = sum(s.correct for s in done)
    low, high = wilson(correct, len(done))
    # What each request kept of its prompt right after its first prefill's decisions.
    shares = [s.kept_frames / frames_for(s.request.prompt_len, page_size, config.layers,
                                         config.kv_heads) for s in done]
    return {
        "strategy": result.strategy, "pool_share": result.share,
        "requests": len(result.states), "completed": len(done),
        "accuracy": round(correct / len(done), 4) if done else 0.0,
        "ci_low": round(low, 4), "ci_high": round(high, 4),
        "completed_per_1k_steps": round(1000.0 * len(done) / max(result.steps, 1), 1),
        "steps": result.steps,
        "mean_wait_steps": round(float(np.mean(waits)), 2),
        "p99_wait_steps": round(float(np.percentile(waits, 99)), 1),
        "max_wait_steps": int(np.max(waits)),
        "preemptions": result.preemptions, "swaps": result.swaps,
        "peak_used_frames": int(max(result.used_frames or [0])),
        "mean_used_frames": round(float(np.mean(result.used_frames or [0])), 1),
        "pool_frames": result.pool_frames,
        "mean_kept_share": round(float(np.mean(shares)), 4) if shares else 0.0,
        # What each request held when its answer ended, of its prompt and answer uncompressed.
        "fixed_fraction": "" if result.fraction is None else round(result.fraction, 4),
        "mean_final_share": round(float(np.mean([
            s.final_frames / frames_for(s.request.prompt_len + len(s.out), page_size,
                                        config.layers, config.kv_heads) for s in done])), 4)
        if done else 0.0,
    }


def request_rows(result: RunResult, config: numpy_model.Config,
                 page_size: int) -> List[Dict[str, object]]:
    rows = []
    for s in result.states:
        r = s.request
        rows.append({
            "strategy": result.strategy, "pool_share": result.share, "request": r.index,
            "task": r.example.task, "length": r.prompt_len, "arrival": r.arrival,
            "admitted": s.admitted, "done": s.done,
            "wait_steps": None if s.admitted is None else s.admitted - r.arrival,
            "preemptions": s.preemptions, "correct": int(s.correct),
            "kept_frames": s.kept_frames, "final_frames": s.final_frames,
            "prompt_frames": frames_for(r.prompt_len, page_size, config.layers, config.kv_heads),
            "final_uncompressed_frames": frames_for(r.prompt_len + len(s.out), page_size,
                                                    config.layers, config.kv_heads)})
    return rows


def paired(rows: List[Dict[str, object]], a: str, b: str) -> List[Dict[str, object]]:
    """Strategy a against b at each pool share, on the same requests (exact McNemar)."""
    out = []
    for share in sorted({r["pool_share"] for r in rows}, reverse=True):
        by = {(r["strategy"], r["request"]): r for r in rows if r["pool_share"] == share}
        common = [i for (s, i) in by if s == a and (b, i) in by
                  and by[(a, i)]["done"] is not None and by[(b, i)]["done"] is not None]
        better, worse = discordant([by[(a, i)]["correct"] for i in common],
                                   [by[(b, i)]["correct"] for i in common])
        out.append({"pool_share": share, "a": a, "b": b, "requests": len(common),
                    "a_correct": sum(by[(a, i)]["correct"] for i in common),
                    "b_correct": sum(by[(b, i)]["correct"] for i in common),
                    "a_only": better, "b_only": worse, "p": round(mcnemar(better, worse), 4)})
    return out


def plot(summary: List[Dict[str, object]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shares = sorted({s["pool_share"] for s in summary}, reverse=True)
    fig, axes = plt.subplots(1, len(shares), figsize=(5 * len(shares), 4), squeeze=False)
    markers = dict(zip(STRATEGIES, "osD^vP"))
    for ax, share in zip(axes[0], shares):
        for s in summary:
            if s["pool_share"] != share:
                continue
            acc = s["accuracy"]
            ax.errorbar([s["completed_per_1k_steps"]], [acc],
                        yerr=[[acc - s["ci_low"]], [s["ci_high"] - acc]],
                        marker=markers.get(s["strategy"], "o"), capsize=3, linestyle="",
                        label=s["strategy"])
        ax.set_title(f"pool = {100 * share:g}% of the offered KV")
        ax.set_xlabel("requests completed per 1,000 decode steps")
        ax.set_ylabel("accuracy (exact match, Wilson 95%)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def matched_fraction(summary: List[Dict[str, object]], share: float) -> float:
    """fixed_matched's budget: the fixed fraction scaled by the manager's mean used frames over
    fixed's at this pool share (one calibration step: a fixed budget's frames grow about in
    proportion to its fraction), so that the two compare at about the same memory."""
    runs = {s["strategy"]: s for s in summary if s["pool_share"] == share}
    if "manager" not in runs or "fixed" not in runs:
        raise ValueError("fixed_matched runs after manager and fixed at the same pool share")
    scale = runs["manager"]["mean_used_frames"] / max(runs["fixed"]["mean_used_frames"], 1.0)
    return float(min(1.0, max(0.01, share * scale)))


def markdown_tables(summary: List[Dict[str, object]], pairs: List[Dict[str, object]]) -> str:
    """The report's tables, generated from the rows summary.csv and paired.csv hold."""
    lines = ["| strategy | pool | completed | accuracy (Wilson 95%) | completed / 1k steps | "
             "mean wait | p99 wait | preemptions | mean used frames | kept at end |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        fraction = f" ({100 * float(s['fixed_fraction']):.0f}%)" \
            if s["strategy"] == "fixed_matched" else ""
        lines.append(
            f"| {s['strategy']}{fraction} | {100 * float(s['pool_share']):g}% | "
            f"{s['completed']}/{s['requests']} | {100 * float(s['accuracy']):.1f}% "
            f"({100 * float(s['ci_low']):.1f}-{100 * float(s['ci_high']):.1f}) | "
            f"{float(s['completed_per_1k_steps']):.0f} | {float(s['mean_wait_steps']):.1f} | "
            f"{float(s['p99_wait_steps']):.0f} | {s['preemptions']} | "
            f"{float(s['mean_used_frames']):.0f} | {100 * float(s['mean_final_share']):.0f}% |")
    lines += ["", "| pool | a | b | a right | b right | only a | only b | McNemar p |",
              "|---|---|---|---|---|---|---|---|"]
    for p in pairs:
        lines.append(f"| {100 * float(p['pool_share']):g}% | {p['a']} | {p['b']} | "
                     f"{p['a_correct']}/{p['requests']} | {p['b_correct']}/{p['requests']} | "
                     f"{p['a_only']} | {p['b_only']} | {p['p']} |")
    return "\n".join(lines) + "\n"


def write_csv(path: str, fields: Sequence[str], rows: List[Dict[str, object]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow(row)


def print_table(summary: List[Dict[str, object]]) -> None:
    print(f"{'strategy':<13} {'pool':>5} {'done':>6} {'accuracy':>9} {'per 1k steps':>13} "
          f"{'wait mean':>10} {'p99':>6} {'preempt':>8} {'mean frames':>12} {'kept at end':>12}")
    for s in summary:
        print(f"{s['strategy']:<13} {100 * s['pool_share']:>4g}% "
              f"{s['completed']:>3}/{s['requests']:<3} {100 * s['accuracy']:>8.1f}% "
              f"{s['completed_per_1k_steps']:>13.1f} {s['mean_wait_steps']:>10.1f} "
              f"{s['p99_wait_steps']:>6.0f} {s['preemptions']:>8} {s['mean_used_frames']:>12.0f} "
              f"{100 * s['mean_final_share']:>11.0f}%")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="entrokvd address; default: start --entrokvd privately")
    parser.add_argument("--entrokvd", default="entrokvd")
    parser.add_argument("--entrokv", default="entrokv", help="the CLI (the policy registry)")
    parser.add_argument("--weights")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rate", type=float, default=2.0, help="arrivals per decode step")
    parser.add_argument("--lengths", default="1024,2048", help="prompt lengths, drawn evenly")
    parser.add_argument("--shares", default="0.5,0.25,0.125",
                        help="pool sizes as shares of the offered uncompressed KV")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--floor", type=float, default=0.25,
                        help="manager: the AutoBudget floor (share of a sequence always kept)")
    parser.add_argument("--target-occupancy", type=float, default=0.7,
                        help="manager: the daemon's --target_occupancy (chosen with --floor on "
                             "development seeds 202 and 203; the daemon's own default is 0.9)")
    parser.add_argument("--prefill-tokens", type=int, default=4096,
                        help="prompt tokens prefilled per step at most")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cache", help="directory for the prompts' prefills (default: memory)")
    parser.add_argument("--out", help="write summary.csv, requests.csv, paired.csv and the plot")
    parser.add_argument("--short", action="store_true", help="print the table only")
    parser.add_argument("--tables", metavar="DIR",
                        help="only regenerate DIR/tables.md and the plot from DIR's CSV files")
    args = parser.parse_args(argv)
    if args.tables:
        with open(os.path.join(args.tables, "summary.csv")) as f:
            summary = list(csv.DictReader(f))
        with open(os.path.join(args.tables, "paired.csv")) as f:
            pairs = list(csv.DictReader(f))
        for row in summary:
            for key in ("pool_share", "accuracy", "ci_low", "ci_high", "completed_per_1k_steps"):
                row[key] = float(row[key])
        with open(os.path.join(args.tables, "tables.md"), "w") as f:
            f.write(markdown_tables(summary, pairs))
        plot(summary, os.path.join(args.tables, "accuracy_throughput.png"))
        return 0

    if not args.weights:
        parser.error("--weights is required (except with --tables)")
    model = numpy_model.Model.load(args.weights)
    registry = policy_registry.load(args.entrokv)
    config = model.config
    lengths = [int(x) for x in args.lengths.split(",") if x]
    shares = [float(x) for x in args.shares.split(",") if x]
    strategies = [s for s in args.strategies.split(",") if s]
    for s in strategies:
        if s not in STRATEGIES:
            parser.error(f"--strategies: {s} is not one of {', '.join(STRATEGIES)}")
    if "fixed_matched" in strategies and (
            "fixed_matched" != strategies[-1] or not {"fixed", "manager"} <= set(strategies)):
        parser.error("--strategies: fixed_matched comes last, after fixed and manager (it is "
                     "fixed at the manager's mean frames)")
    requests = workload(args.requests, args.rate, args.seed, lengths)
    offered = offered_frames(requests, args.rate, config, 16)
    largest = max(frames_for(r.prompt_len + r.max_new, 16, config.layers, config.kv_heads)
                  for r in requests)
    pools = {share: max(int(math.ceil(share * offered)), 0) for share in shares}
    for share, frames in pools.items():
        if frames < largest:
            parser.error(f"--shares: {share} of the offered KV is {frames} frames, less than one "
                         f"request ({largest}); raise --rate")
    frame_bytes = 2 * 16 * config.head_dim * 4
    cache = PrefillCache(model, args.cache)
    print(f"serving under pressure: {len(requests)} requests ({', '.join(tasks.TASKS)}; "
          f"prompts of {', '.join(map(str, lengths))} tokens), {args.rate:g} arrivals per step "
          f"(seed {args.seed}), offered KV {offered:.0f} frames; pools "
          f"{', '.join(f'{100 * s:g}% = {f}' for s, f in pools.items())} frames; "
          f"{POLICY}, manager floor {args.floor:g}", flush=True)
    started = time.perf_counter()
    for i, r in enumerate(requests):  # every prefill first, so that runs time decoding only
        cache.get(r.key, r.example.prompt)
    prefill_s = time.perf_counter() - started
    daemon = None
    if not args.server:
        daemon = pool_worker.LocalDaemon(
            args.entrokvd, f"--pool_capacity_bytes={max(pools.values()) * frame_bytes * 2}",
            f"--max_swap_bytes={max(pools.values()) * frame_bytes * 4}",
            f"--target_occupancy={args.target_occupancy}")
    address = args.server or daemon.address
    summary, rows = [], []
    try:
        with entrokv.Client(address, timeout_s=120) as client:
            for share in shares:
                for strategy in strategies:
                    run_started = time.perf_counter()
                    serving = Serving(client, model, registry, cache, strategy, share,
                                      pools[share], floor=args.floor,
                                      prefill_tokens=args.prefill_tokens,
                                      fraction=matched_fraction(summary, share)
                                      if strategy == "fixed_matched" else None)
                    try:
                        result = serving.run(requests)
                        stats = client.pool_stats(serving.model_id)
                    finally:
                        serving.close()
                    summary.append(summarize(result, config, 16))
                    rows.extend(request_rows(result, config, 16))
                    if stats.used_frames != 0 or \
                            stats.used_frames + stats.free_frames != stats.capacity_frames:
                        print(f"LEAK: {strategy} at {share}: {stats}", file=sys.stderr)
                        return 1
                    if not args.short:
                        print(f"  {strategy} at {100 * share:g}%: {result.steps} steps, "
                              f"{time.perf_counter() - run_started:.0f} s", flush=True)
    finally:
        if daemon is not None:
            daemon.stop()
    print_table(summary)
    pairs = [p for a, b in (("manager", "fixed"), ("manager", "fixed_matched"),
                            ("manager", "fcfs"), ("manager", "recompute"),
                            ("manager_swap", "manager"))
             if a in strategies and b in strategies for p in paired(rows, a, b)]
    for p in pairs:
        print(f"paired at {100 * p['pool_share']:g}%: {p['a']} {p['a_correct']}/{p['requests']} "
              f"vs {p['b']} {p['b_correct']}/{p['requests']} ({p['a']} only {p['a_only']}, "
              f"{p['b']} only {p['b_only']}, McNemar p = {p['p']})")
    print(f"prefill of {len(requests)} prompts {prefill_s:.0f} s; "
          f"{time.perf_counter() - started:.0f} s in all; every pool 0 used frames after its run")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        write_csv(os.path.join(args.out, "summary.csv"), SUMMARY_FIELDS, summary)
        write_csv(os.path.join(args.out, "requests.csv"), REQUEST_FIELDS, rows)
        write_csv(os.path.join(args.out, "paired.csv"),
                  ("pool_share", "a", "b", "requests", "a_correct", "b_correct", "a_only",
                   "b_only", "p"), pairs)
        plot(summary, os.path.join(args.out, "accuracy_throughput.png"))
        with open(os.path.join(args.out, "tables.md"), "w") as f:
            f.write(markdown_tables(summary, pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
