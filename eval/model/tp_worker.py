#!/usr/bin/python3
"""The pool-backed model worker with tensor parallelism: one driver, one worker process per rank.

The small GQA model (8 query heads, 2 KV groups) is split as tensor parallelism splits attention:
rank r of t holds the weights of its KV groups [r G/t, (r+1) G/t) and of their query heads
[r H_Q/t, (r+1) H_Q/t): the rows of wq, wk and wv that make them and the columns of wo that
read them. Each rank is a process of its own with its own entrokv.Client connection.

The driver is the scheduler. It registers the model once with tensor_parallel_size t (host
backend: the daemon gives one arena per rank), opens, grows and closes every sequence once for
the model, and hands each rank its groups' rows of the block tables. In the LAYER frame layout
rank r's arena holds its groups' slice of every frame (a frame id names the same page in every
rank's arena); in the GROUP layout a frame is one group's page and lives whole in the arena of
the rank holding the group (the rank's frames are its own). Per layer it sends the hidden state to every rank; a rank writes its groups' K/V
into its own arena at the frames the tables name, reads back the pages the tables still name,
attends with its heads and returns its partial output (its heads' attention @ its wo columns).
The driver sums the partials (the all-reduce of tensor parallelism) and runs the rest itself:
the residual, the MLP, the final norm and the logits, which tensor parallelism would replicate
or shard with no effect on the KV cache (here they are simply computed once, on the driver).

Eviction: during prefill each rank measures its own heads' statistic ([layers, H_Q/t, tokens])
and, once the prompt has run, sends it with Decide and rank=r. In the LAYER layout the daemon
gathers the ranks, decides once over all H_Q rows and answers every rank the same decision; in
the GROUP layout each rank's groups are decided alone, as soon as its Decide comes. The driver
then rereads the tables from the daemon and hands them out again.
(The one-rank worker streams its layers on DecideStream while prefill runs; the ranks here
decide after the prompt, all layers in one Decide: layer l's eviction does not change what any
layer computes during prefill, so the pages are the same. DecideStream with `rank` set would
gather the ranks per layer too.)

Decoding is greedy, as in pool_worker: the driver appends each token (AppendTokens, once for
the model) and gives each rank its groups' new frames.

  PYTHONPATH=build/client/python /usr/bin/python3 eval/model/tp_worker.py \\
      --entrokvd build/service/entrokvd --entrokv build/client/cli/entrokv \\
      --weights eval/model/weights.npz --prompts 4 --policy page_entrokv --ratio 0.75
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import multiprocessing
import os
import sys
import time
import traceback
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import policies as policy_registry  # noqa: E402
import pool_worker  # noqa: E402
import tasks  # noqa: E402
from pool_worker import Policy  # noqa: E402

import entrokv  # noqa: E402  (client/python; PYTHONPATH=<build>/client/python)

ATTENTION = ("wq", "wk", "wv", "wo")  # the sharded weights of a layer


# ---- the weights of one rank ---------------------------------------------------------------------
def rank_weights(model: numpy_model.Model, rank: int, ranks: int) -> Tuple[numpy_model.Config,
                                                                           Dict[str, np.ndarray]]:
    """Rank `rank`'s share of the attention: a Config of its heads and groups and the weights
    its attention reads (its rows of wq, wk, wv, its columns of wo, the replicated norm gain)."""
    c = model.config
    if c.kv_heads % ranks:
        raise ValueError(f"tensor_parallel_size {ranks} does not divide the {c.kv_heads} KV "
                         "groups")
    groups, heads, d = c.kv_heads // ranks, c.query_heads // ranks, c.head_dim
    q_rows = slice(rank * heads * d, (rank + 1) * heads * d)
    kv_rows = slice(rank * groups * d, (rank + 1) * groups * d)
    weights = {}
    for layer in range(c.layers):
        p = f"layers.{layer}."
        weights[p + "attn_norm.weight"] = model.w[p + "attn_norm.weight"]
        weights[p + "wq.weight"] = model.w[p + "wq.weight"][q_rows].copy()
        weights[p + "wk.weight"] = model.w[p + "wk.weight"][kv_rows].copy()
        weights[p + "wv.weight"] = model.w[p + "wv.weight"][kv_rows].copy()
        weights[p + "wo.weight"] = model.w[p + "wo.weight"][:, q_rows].copy()
    return dataclasses.replace(c, query_heads=heads, kv_heads=groups), weights


def driver_weights(model: numpy_model.Model) -> Dict[str, np.ndarray]:
    """Everything but the sharded attention weights: what the driver computes with."""
    return {name: w for name, w in model.w.items()
            if not any(name.endswith(f".{a}.weight") for a in ATTENTION)}


# ---- a rank's process ----------------------------------------------------------------------------
class _Shard:
    """What PoolKV needs of a worker, for one rank: its groups, the page size, its arena."""

    def __init__(self, config: numpy_model.Config, page_size: int, arena):
        self.model = numpy_model.Model(config, {})
        self.page_size, self.arena = page_size, arena


def _rank_main(rank: int, address: str, model_id: str, element: str,
               config: numpy_model.Config, weights: Dict[str, np.ndarray], connection) -> None:
    """A rank's worker: answers the driver's commands on `connection` until "stop".

    Commands (tuples): ("open", sid, length, tables), ("tables", sid, tables),
    ("append", sid, length, rows), ("layer", sid, layer, x, positions, window),
    ("decide", sid, arguments), ("close", sid), ("stop",). Every answer is ("ok", value) or
    ("error", text)."""
    client, arena = None, None
    try:
        client = entrokv.Client(address, timeout_s=60)
        pool = client.get_model(model_id)
        arena = pool_worker.HostArena(pool, element, rank=rank)
        shard = _Shard(config, pool.geometry.page_size, arena)
        model = numpy_model.Model(config, weights)
        sequences: Dict[str, pool_worker.PoolKV] = {}
        connection.send(("ok", os.getpid()))
    except Exception:  # noqa: BLE001 -- reported to the driver, which raises it
        connection.send(("error", f"rank {rank} did not start:\n{traceback.format_exc()}"))
        if arena is not None:
            arena.close()
        if client is not None:
            client.close()
        return
    try:
        while True:
            command = connection.recv()
            name, sid = command[0], command[1] if len(command) > 1 else None
            try:
                value = None
                if name == "stop":
                    connection.send(("ok", None))
                    return
                if name == "open":
                    _, _, length, tables = command
                    kv = pool_worker.PoolKV(shard, sid, length)
                    kv.set_tables(tables)
                    kv.stats = {}
                    sequences[sid] = kv
                elif name == "tables":
                    sequences[sid].set_tables(command[2])
                elif name == "append":
                    _, _, length, rows = command
                    kv = sequences[sid]
                    kv._reserve(length)
                    kv.length = length
                    kv.assign(rows)
                elif name == "layer":
                    _, _, layer, x, positions, statistic = command
                    kv = sequences[sid]
                    window = statistic[1] if statistic else 0
                    partial, stat = model._attention(layer, x, positions, kv, window)
                    if statistic:  # this rank's heads' rows, groups in order
                        rows = np.concatenate(stat, axis=0)
                        kv.stats[layer] = rows * float(len(x)) if statistic[0] == "accumulated" \
                            else rows
                    value = partial
                elif name == "decide":
                    kv = sequences[sid]
                    stats = np.stack([kv.stats[l] for l in sorted(kv.stats)])
                    decisions = client.decide(model_id, sid, stats, rank=rank, **command[2])
                    value = [(d.layer, [g.kept_pages.copy() for g in d.groups],
                              d.freed_frames.copy(), d.quota_pages) for d in decisions]
                elif name == "close":
                    del sequences[sid]
                else:
                    raise ValueError(f"unknown command {name!r}")
                connection.send(("ok", value))
            except Exception:  # noqa: BLE001 -- the driver raises it with the rank named
                connection.send(("error", f"rank {rank}, {name} {sid}:\n"
                                          f"{traceback.format_exc()}"))
    finally:
        arena.close()
        client.close()


# ---- the driver ----------------------------------------------------------------------------------
@dataclasses.dataclass
class TPResult:
    """One prompt under one policy, run with t ranks."""
    policy: str
    answer: List[int]
    correct: bool
    logits: np.ndarray  # [1 + decode steps, vocab]
    kept_pages: List[List[np.ndarray]]  # per rank, per layer: the kept pages its Decide returned
    tables: np.ndarray  # [layers, groups, pages] right after the decision
    kept_frames: int  # distinct frames the tables name after the decision
    freed_frames: int
    prefill_ms: float
    decide_ms: float
    decode_ms: float


@dataclasses.dataclass
class _Sequence:
    sequence_id: str
    length: int
    tables: np.ndarray  # [layers, groups, pages]


class TPDriver:
    """The scheduler of a tensor-parallel pool-backed model: t rank processes, one sequence
    lifecycle. Use as a context manager, or call close()."""

    def __init__(self, address: str, model: numpy_model.Model,
                 registry: policy_registry.Registry, *, tensor_parallel_size: int = 2,
                 model_id: Optional[str] = None, page_size: int = 16, element: str = "f32",
                 capacity_frames: int = 4096, devices: Optional[Sequence[int]] = None,
                 frame_layout: str = "layer", start_method: str = "spawn"):
        """capacity_frames: of the LAYER layout (each holds every group); a GROUP pool gets the
        same bytes, kv_groups times as many frames."""
        c = model.config
        t = tensor_parallel_size
        if t < 1 or c.kv_heads % t:
            raise ValueError(f"tensor_parallel_size {t} must divide the {c.kv_heads} KV groups")
        if frame_layout not in ("layer", "group"):
            raise ValueError(f"frame_layout: {frame_layout!r} is not 'layer' or 'group'")
        self.config, self.registry, self.page_size, self.ranks = c, registry, page_size, t
        self.frame_layout = frame_layout
        self.model = numpy_model.Model(c, driver_weights(model))  # no attention weights
        self.model_id = model_id or f"entrokv-gqa-tp{t}-{frame_layout}-b{page_size}-{element}"
        self.client = entrokv.Client(address, timeout_s=60)
        self._ids = itertools.count()
        self._processes: List[multiprocessing.Process] = []
        self._connections = []
        element_bytes = np.dtype(pool_worker.ELEMENTS[element]).itemsize
        frame_bytes = c.kv_heads * 2 * page_size * c.head_dim * element_bytes
        try:
            self.pool = self.client.register_model(
                self.model_id, layers=c.layers, query_heads=c.query_heads, kv_groups=c.kv_heads,
                head_dim=c.head_dim, page_size=page_size, element_bytes=element_bytes,
                capacity_bytes=capacity_frames * frame_bytes, frame_layout=frame_layout,
                backend="host", tensor_parallel_size=t, devices=devices)
            if len(self.pool.ranks) != t:
                raise RuntimeError(f"model {self.model_id}: the daemon gave "
                                   f"{len(self.pool.ranks)} rank arenas for {t} ranks")
            context = multiprocessing.get_context(start_method)
            for rank in range(t):
                config, weights = rank_weights(model, rank, t)
                here, there = context.Pipe()
                process = context.Process(
                    target=_rank_main, name=f"tp-rank-{rank}", daemon=True,
                    args=(rank, address, self.model_id, element, config, weights, there))
                process.start()
                there.close()
                self._processes.append(process)
                self._connections.append(here)
            self._gather([None] * t)  # each rank says it started (or why not)
        except BaseException:
            self.close()
            raise

    # -- talking to the ranks --
    def _gather(self, commands: Sequence[Optional[tuple]]) -> list:
        """Sends commands[r] to rank r (None: send nothing, only receive), then receives every
        rank's answer: the ranks run at once. Raises RuntimeError with each failed rank's error."""
        for connection, command in zip(self._connections, commands):
            if command is not None:
                connection.send(command)
        answers, errors = [], []
        for rank, (connection, process) in enumerate(zip(self._connections, self._processes)):
            if not connection.poll(120):
                errors.append(f"rank {rank}: no answer in 120 s (process "
                              f"{'alive' if process.is_alive() else 'exited'})")
                answers.append(None)
                continue
            try:
                status, value = connection.recv()
            except EOFError:
                status, value = "error", f"rank {rank}: its process ended (exit code " \
                                         f"{process.exitcode})"
            if status != "ok":
                errors.append(value)
            answers.append(value)
        if errors:
            raise RuntimeError("tensor-parallel ranks failed:\n" + "\n".join(errors))
        return answers

    def _each(self, *command) -> list:
        return self._gather([command] * self.ranks)

    def _per_rank_tables(self, tables: np.ndarray) -> List[np.ndarray]:
        g = self.config.kv_heads // self.ranks
        return [np.ascontiguousarray(tables[:, r * g:(r + 1) * g]) for r in range(self.ranks)]

    def _send_tables(self, seq: _Sequence, first: bool = False) -> None:
        seq.tables = pool_worker.block_tables(self.client, self.model_id, seq.sequence_id,
                                              self.config.layers, self.config.kv_heads)
        shares = self._per_rank_tables(seq.tables)
        if first:
            self._gather([("open", seq.sequence_id, seq.length, s) for s in shares])
        else:
            self._gather([("tables", seq.sequence_id, s) for s in shares])

    # -- the model --
    def _forward(self, seq: _Sequence, tokens: np.ndarray, positions: np.ndarray,
                 statistic: Optional[Tuple[str, int]] = None,
                 ranks_used: Optional[Sequence[int]] = None) -> np.ndarray:
        """Logits [n, vocab] of new tokens. statistic: (kind, window) the ranks keep per layer.
        ranks_used: whose partial outputs the all-reduce sums (all; tests drop one to see the
        answers change)."""
        x = self.model.w["embed.weight"][tokens].astype(np.float32)
        for layer in range(self.config.layers):
            partials = self._each("layer", seq.sequence_id, layer, x, positions, statistic)
            used = range(self.ranks) if ranks_used is None else ranks_used
            x = x + np.sum([partials[r] for r in used], axis=0, dtype=np.float32)  # all-reduce
            x = x + self.model._mlp(layer, x)
        x = numpy_model.rms_norm(x, self.model.w["norm.weight"], self.config.norm_eps)
        return x @ self.model.w["output.weight"].T

    def kind(self, policy: Policy) -> str:
        return pool_worker.statistic_kind(self.registry, policy)

    # -- a whole prompt --
    def run_prompt(self, example: tasks.Example, policy: Policy, *,
                   max_new: Optional[int] = None, eos: int = tasks.EOS,
                   ranks_used: Optional[Sequence[int]] = None) -> TPResult:
        """Open, prefill (the ranks keep their heads' statistic), every rank's Decide, greedy
        decode, close."""
        prompt = np.asarray(example.prompt)
        n = len(prompt)
        sid = f"tp-{os.getpid()}-{next(self._ids)}"
        self.client.open_sequence(self.model_id, sid, initial_tokens=n)
        seq = _Sequence(sid, n, np.zeros((0, 0, 0), np.int32))
        opened = False
        try:
            self._send_tables(seq, first=True)
            opened = True
            deciding = policy.name != "none"
            statistic = None
            if deciding:
                kind = self.kind(policy)
                window = {"last_row": 1, "window_mean": pool_worker.question_window(prompt),
                          "accumulated": n}[kind]
                statistic = (kind, window)
            start = time.perf_counter()
            logits = self._forward(seq, prompt, np.arange(n), statistic, ranks_used)
            prefill_ms = (time.perf_counter() - start) * 1e3
            kept: List[List[np.ndarray]] = [[] for _ in range(self.ranks)]
            freed = 0
            start = time.perf_counter()
            if deciding:
                arguments = dict(policy=policy.name, kind=statistic[0], **policy.budget(),
                                 **dict(policy.params))
                answers = self._each("decide", sid, arguments)
                for rank, decisions in enumerate(answers):
                    kept[rank] = [groups for _, groups, _, _ in decisions]
                # LAYER: one decision, every rank told it; GROUP: each rank freed its own.
                deciders = answers if self.frame_layout == "group" else answers[:1]
                freed = sum(len(f) for decisions in deciders for _, _, f, _ in decisions)
                self._send_tables(seq)
            decide_ms = (time.perf_counter() - start) * 1e3
            tables = seq.tables.copy()
            kept_frames = len(np.unique(tables[tables >= 0]))
            start = time.perf_counter()
            rows = [logits[-1]]
            answer: List[int] = []
            token = int(np.argmax(rows[-1]))
            budget = max_new or tasks.answer_budget(example)
            while token != eos and len(answer) < budget:
                answer.append(token)
                position = seq.length
                length, new = self.client.append_tokens_frames(self.model_id, sid, 1)
                seq.length = length
                g = self.config.kv_heads // self.ranks
                self._gather([("append", sid, length,
                               self._rank_rows(new, r * g, (r + 1) * g))
                              for r in range(self.ranks)])
                rows.append(self._forward(seq, np.array([token]), np.array([position]),
                                          ranks_used=ranks_used)[-1])
                token = int(np.argmax(rows[-1]))
            decode_ms = (time.perf_counter() - start) * 1e3
        finally:
            if opened:
                self._each("close", sid)
            self.client.close_sequence(self.model_id, sid)
        return TPResult(policy=policy.label(), answer=answer,
                        correct=tasks.is_correct(example, answer), logits=np.stack(rows),
                        kept_pages=kept, tables=tables, kept_frames=kept_frames,
                        freed_frames=freed, prefill_ms=prefill_ms, decide_ms=decide_ms,
                        decode_ms=decode_ms)

    @staticmethod
    def _rank_rows(rows: np.ndarray, first: int, end: int) -> np.ndarray:
        """AppendTokens' (layer, group, page, frame) rows of groups [first, end), renumbered
        from 0 (the rank's own groups)."""
        mine = rows[(rows[:, 1] >= first) & (rows[:, 1] < end)].copy() if len(rows) else rows
        if len(mine):
            mine[:, 1] -= first
        return mine

    def close(self, unregister: bool = True) -> None:
        """Stops and joins the rank processes, then unregisters the model."""
        for connection, process in zip(self._connections, self._processes):
            try:
                if process.is_alive():
                    connection.send(("stop",))
                    if connection.poll(30):
                        connection.recv()
            except (OSError, EOFError):
                pass
        for process in self._processes:
            process.join(timeout=30)
            if process.is_alive():  # did not stop in time: ours to end
                process.terminate()
                process.join(timeout=10)
        for connection in self._connections:
            connection.close()
        self._processes, self._connections = [], []
        if self.client is not None:
            try:
                if unregister and getattr(self, "pool", None) is not None:
                    self.client.unregister_model(self.model_id, force=True)
            finally:
                self.client.close()
                self.client = None

    def __enter__(self) -> "TPDriver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run the small GQA model tensor-parallel (a process per rank) with entrokvd "
                    "as its KV cache, and the one-rank pool worker on the same prompts; print "
                    "both answers.")
    parser.add_argument("--server", help="entrokvd address (started with --host_devices >= t); "
                                         "default: start --entrokvd privately")
    parser.add_argument("--entrokvd", default="entrokvd")
    parser.add_argument("--entrokv", default="entrokv", help="the CLI (the policy registry)")
    parser.add_argument("--weights", required=True)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--policy", default="page_entrokv")
    parser.add_argument("--ratio", type=float, default=0.75)
    parser.add_argument("--tensor-parallel-size", type=int, default=2)
    parser.add_argument("--frame-layout", choices=("layer", "group"), default="layer")
    args = parser.parse_args(argv)

    registry = policy_registry.load(args.entrokv)
    model = numpy_model.Model.load(args.weights)
    per_task = -(-args.prompts // len(tasks.TASKS))
    examples = [e for t in tasks.TASKS for e in tasks.examples(t, args.length, per_task, 0)]
    examples = examples[:args.prompts]
    policies = [Policy("none"), Policy(args.policy, ratio=args.ratio)]
    t = args.tensor_parallel_size
    daemon = None if args.server else pool_worker.LocalDaemon(args.entrokvd,
                                                              f"--host_devices={t}")
    address = args.server or daemon.address
    same = 0
    try:
        with entrokv.Client(address, timeout_s=60) as client, \
                TPDriver(address, model, registry, tensor_parallel_size=t,
                         frame_layout=args.frame_layout) as driver:
            frames = 4096 * (model.config.kv_heads if args.frame_layout == "group" else 1)
            single = pool_worker.PoolWorker(client, model, registry,
                                            frame_layout=args.frame_layout,
                                            capacity_frames=frames)
            try:
                for policy in policies:
                    for example in examples:
                        one = single.run_prompt(example, policy)
                        tp = driver.run_prompt(example, policy)
                        same += one.answer == tp.answer
                        rows = min(len(one.logits), len(tp.logits))
                        drift = float(np.abs(one.logits[:rows] - tp.logits[:rows]).max())
                        print(f"{example.task:<14} {policy.label():<20} TP=1 {one.answer} "
                              f"TP={t} {tp.answer} kept frames {one.kept_frames}/"
                              f"{tp.kept_frames}, max |logit difference| {drift:.1e} "
                              f"{'same' if one.answer == tp.answer else 'DIFF'}")
            finally:
                single.close(unregister=True)
            stats = client.pool_stats(driver.model_id)
            print(f"TP={t} pool after every close: {stats.used_frames} used + "
                  f"{stats.free_frames} free = {stats.capacity_frames} frames")
    finally:
        if daemon is not None:
            daemon.stop()
    total = len(examples) * len(policies)
    print(f"{same}/{total} answers the same")
    return 0 if same == total else 1


if __name__ == "__main__":
    sys.exit(main())
