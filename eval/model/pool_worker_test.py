"""The pool-backed worker against a real entrokvd on loopback (started here, stopped by SIGTERM).

Random weights of the real shapes: these tests compare the worker with the plain numpy model and
with itself, which needs no trained model. ENTROKVD names the daemon binary, ENTROKV_CLI the CLI
(the policy registry) and PYTHONPATH holds the built client package (ctest sets all three).
"""
import concurrent.futures
import io
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import policies  # noqa: E402
import tasks  # noqa: E402
from model_test import random_model  # noqa: E402

try:
    import entrokv  # noqa: E402
    import pool_worker  # noqa: E402
    from pool_worker import Policy  # noqa: E402
except ImportError:  # the client package is not on the path: run through ctest
    entrokv = None

# Pool-backed attention stores K/V as float32 and reads them back in page order, which is the
# order the plain model holds them in, so with no eviction the logits agree to float32 rounding
# (in practice bit for bit); 1e-5 is the stated tolerance.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)
LAYERS, GROUPS = 4, 2


def plain_logits(model, prompt, answer_tokens):
    """Prefill logits [T, vocab] and the decode logits rows of feeding `answer_tokens`, with the
    plain model's dense cache."""
    kv = numpy_model.DenseKV(model.config)
    prefill = model.step(prompt, np.arange(len(prompt)), kv)
    rows = [prefill[-1]]
    for i, token in enumerate(answer_tokens):
        rows.append(model.step(np.array([token]), np.array([len(prompt) + i]), kv)[-1])
    return prefill, np.stack(rows)


def cover_then_fill(rows: np.ndarray, keys: np.ndarray, per_group: int, page_size: int,
                    mass: float, question_kernel: int = 7, keys_kernel: int = 3,
                    forward: bool = False, rank_sinks: bool = False) -> np.ndarray:
    """The cover rule (core/scoring/cover_mix.h) computed here, for the daemon's defaults (4
    sink tokens, the tail page protected): per KV group, the pages the question's rows rank
    highest (the group mean, max-pooled (forward if `forward`), page maxima, ties to the lower
    page) past the sink page (from page 0 with `rank_sinks`) and before the tail until they hold
    `mass` of its mass there past the sink tokens, then the rest in the keys' ranking (each
    head's row max-pooled, then their mean); a page scores the page count less its place."""
    heads, tokens = rows.shape
    out = np.empty((heads, tokens), np.float32)
    for start in range(0, heads, per_group):
        question = pool_worker.group_mean(rows[start:start + per_group])
        # The keys as a policy with that neighbourhood pools them: each head, then the mean.
        heads_pooled = [pool_worker.neighbourhood_max(row, keys_kernel)
                        for row in keys[start:start + per_group]]
        keys_pooled = pool_worker.group_mean(np.stack(heads_pooled))
        score = pool_worker.cover_scores(
            pool_worker.question_cover(question, page_size, mass, question_kernel, forward,
                                       rank_sinks),
            pool_worker.page_ranking(keys_pooled, 1, page_size))
        out[start:start + per_group] = np.repeat(score, page_size)[:tokens]
    return out


class DaemonFixture:
    """A test class's daemon (ENTROKVD) on loopback, its client, the policy registry (ENTROKV_CLI)
    and a random model of the real shapes; the daemon must exit 0 on SIGTERM. The pool worker
    tests of both backends share it (mixed in before unittest.TestCase)."""

    @classmethod
    def setUpClass(cls):
        cls.registry = policies.load(os.environ["ENTROKV_CLI"])
        cls.daemon = pool_worker.LocalDaemon(os.environ["ENTROKVD"])
        cls.client = entrokv.Client(cls.daemon.address, timeout_s=60)
        cls.model = random_model()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        code = cls.daemon.stop()
        if code != 0:
            raise AssertionError(f"entrokvd exited with {code} after SIGTERM")


@unittest.skipIf(entrokv is None or "ENTROKVD" not in os.environ,
                 "needs ENTROKVD and the client package on PYTHONPATH (run through ctest)")
class LocalDaemonTest(unittest.TestCase):
    def test_a_tool_killed_outright_leaves_no_daemon(self):
        # A tool (here a child Python) starts its private daemon and is killed with SIGKILL,
        # which it cannot catch: the daemon gets SIGTERM from the kernel and exits.
        tool = subprocess.Popen(
            [sys.executable, "-c",
             "import sys, time, pool_worker; d = pool_worker.LocalDaemon(sys.argv[1]); "
             "print(d.process.pid, flush=True); time.sleep(600)", os.environ["ENTROKVD"]],
            stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
        self.addCleanup(tool.stdout.close)
        daemon = int(tool.stdout.readline())
        os.kill(daemon, 0)  # running
        tool.kill()
        tool.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{daemon}/stat") as f:
                    state = f.read().rpartition(")")[2].split()[0]
            except FileNotFoundError:
                return  # exited and reaped
            if state == "Z":
                return  # exited; whoever adopted it has not reaped it yet
            time.sleep(0.05)
        os.kill(daemon, signal.SIGKILL)
        self.fail(f"entrokvd {daemon} still ran 30 s after the tool that started it was killed")

    def test_a_daemon_started_from_a_thread_outlives_the_thread(self):
        # A test's restart thread starts a daemon and ends; the daemon must go on serving.
        started = []
        thread = threading.Thread(
            target=lambda: started.append(pool_worker.LocalDaemon(os.environ["ENTROKVD"])))
        thread.start()
        thread.join()
        daemon = started[0]
        time.sleep(0.5)
        self.assertIsNone(daemon.process.poll(), "the daemon stopped with its thread")
        with entrokv.Client(daemon.address, timeout_s=10) as client:
            client.list_models()
        self.assertEqual(daemon.stop(), 0)


@unittest.skipIf(entrokv is None or "ENTROKVD" not in os.environ or
                 "ENTROKV_CLI" not in os.environ,
                 "needs ENTROKVD, ENTROKV_CLI and the client package on PYTHONPATH (run through "
                 "ctest)")
class PoolWorkerTest(DaemonFixture, unittest.TestCase):
    def worker(self, name, registry=None, **kwargs):
        worker = pool_worker.PoolWorker(self.client, self.model, registry or self.registry,
                                        model_id=name, **kwargs)
        self.addCleanup(worker.close, unregister=True)
        return worker

    def assert_pool_consistent(self, worker):
        stats = self.client.pool_stats(worker.model_id)
        self.assertEqual(stats.used_frames + stats.free_frames, stats.capacity_frames)
        return stats

    def test_no_eviction_equals_the_plain_model(self):
        # Lengths off the page grid (partial tail pages), both layouts, two page sizes.
        for layout, page_size, length in (("group", 16, 250), ("layer", 16, 250),
                                          ("group", 32, 301)):
            with self.subTest(layout=layout, page_size=page_size):
                worker = self.worker(f"plain-{layout}-{page_size}", frame_layout=layout,
                                     page_size=page_size, capacity_frames=2048)
                example = tasks.make_example("multi_value", length, 5)
                kv, decisions = worker.prefill(example.prompt)
                self.assertEqual(decisions, [])
                answer, logits = worker.decode(kv, max_new=6, eos=-1)  # -1: never stops early
                self.assertEqual(len(answer), 6)
                prefill, want = plain_logits(self.model, example.prompt, answer)
                np.testing.assert_allclose(kv.prefill_logits, prefill, **TOLERANCE)
                np.testing.assert_allclose(logits, want, **TOLERANCE)
                self.assertEqual(answer, self.model.generate(example.prompt, 6, eos=-1))
                self.assertEqual(worker.close_sequence(kv), kv.live_frames())
                self.assertEqual(self.assert_pool_consistent(worker).used_frames, 0)

    def test_half_precision_frames_round_only(self):
        # f16 K/V (element_bytes 2): the pool holds rounded keys and values, nothing else changes.
        worker = self.worker("plain-f16", element="f16", capacity_frames=1024)
        example = tasks.make_example("multi_key", 250, 1)
        kv, _ = worker.prefill(example.prompt)
        self.assertEqual(worker.arena.frames.dtype, np.float16)
        prefill = self.model.forward(example.prompt)
        np.testing.assert_allclose(kv.prefill_logits, prefill, rtol=1e-2, atol=1e-2)
        self.assertFalse(np.array_equal(kv.prefill_logits, prefill))
        worker.close_sequence(kv)

    def test_poisoned_free_frames_are_never_read(self):
        example = tasks.make_example("multi_key", 300, 2)
        for layout in ("group", "layer"):
            for policy in (Policy("page_entrokv", pages=5), Policy("h2o", ratio=0.75),
                           Policy("snapkv", ratio=0.5, params=(("protect_tail_page", False),))):
                with self.subTest(layout=layout, policy=policy.label()):
                    worker = self.worker(f"poison-{layout}-{policy.name}", frame_layout=layout,
                                         capacity_frames=1024)
                    clean = worker.run_prompt(example, policy)
                    poisoned_frames = []

                    def poison(kv, decisions):
                        # Every frame no open sequence names: the evicted ones included.
                        used = {int(f) for s in self.client.list_sequences(
                                    worker.model_id, block_tables=True)
                                for t in s.block_tables for f in t.frames if f >= 0}
                        free = sorted(set(range(worker.pool.capacity_frames)) - used)
                        freed = {int(f) for d in decisions for f in d.freed_frames}
                        self.assertTrue(freed, "the decision evicted nothing")
                        self.assertTrue(freed <= set(free))
                        worker.arena.frames[free] = np.nan
                        poisoned_frames.extend(free)

                    dirty = worker.run_prompt(example, policy, on_decided=poison)
                    self.assertGreater(len(poisoned_frames), 0)
                    self.assertEqual(dirty.answer, clean.answer)
                    np.testing.assert_array_equal(dirty.logits, clean.logits)
                    self.assertTrue(np.all(np.isfinite(dirty.logits)))
                    self.assert_pool_consistent(worker)

    def test_poison_in_a_kept_frame_is_seen(self):
        # The control of the test above: the same poison in a frame the sequence keeps reaches
        # the logits, so the unchanged logits there mean the evicted frames were not read.
        worker = self.worker("poison-control", capacity_frames=1024)
        example = tasks.make_example("multi_key", 300, 2)

        def poison_kept(kv, decisions):
            worker.arena.frames[kv.tables[1, 0, decisions[1].groups[0].kept_pages[0]]] = np.nan

        result = worker.run_prompt(example, Policy("page_entrokv", pages=5),
                                   on_decided=poison_kept)
        self.assertGreater(len(result.logits), 1)
        self.assertTrue(np.all(np.isnan(result.logits[1:])))

    def test_decisions_keep_exactly_the_budget_and_free_the_rest(self):
        example = tasks.make_example("single_needle", 400, 3)  # 25 pages
        pages = -(-400 // 16)
        for layout, policy in (("group", Policy("page_entrokv", pages=6)),
                               ("group", Policy("mean", ratio=0.5)),
                               ("group", Policy("mean", ratio=0.5, allocator="mass",
                                                layer_floor=0.25)),
                               ("layer", Policy("page_entrokv", pages=6))):
            with self.subTest(layout=layout, policy=policy.label()):
                name = f"budget-{layout}-{policy.name}-{policy.pages}-{policy.allocator}"
                worker = self.worker(name, frame_layout=layout, capacity_frames=1024)
                seen = {}

                def check(kv, decisions):
                    seen["used"] = self.assert_pool_consistent(worker).used_frames
                    seen["kv"] = kv

                result = worker.run_prompt(example, policy, on_decided=check)
                per_frame = GROUPS if layout == "group" else 1  # layer scope in the layer layout
                quota = sum(result.quota_pages)
                if policy.pages is not None:
                    self.assertEqual(result.quota_pages, [6] * LAYERS)
                else:  # a half of the sequence, however the allocator spreads it
                    self.assertEqual(quota, LAYERS * 400 // 2 // 16)
                self.assertEqual(result.kept_frames, per_frame * quota)  # G * K per layer
                self.assertEqual(result.prompt_frames, LAYERS * per_frame * pages)
                self.assertEqual(result.freed_frames, result.prompt_frames - result.kept_frames)
                self.assertEqual(seen["used"], result.kept_frames)  # nothing else is open
                for layer in range(LAYERS):
                    for group in range(GROUPS):
                        live = np.flatnonzero(seen["kv"].tables[layer, group, :pages] >= 0)
                        self.assertEqual(len(live), result.quota_pages[layer])
                self.assertEqual(self.assert_pool_consistent(worker).used_frames, 0)

    def test_concurrent_sequences_reuse_frames_and_match_their_solo_runs(self):
        # 8 prompts on 4 threads in a pool too small to give every sequence its own frames:
        # frames one sequence evicted or closed are written by others, and each sequence still
        # computes what it computes alone.
        worker = self.worker("concurrent", capacity_frames=640)
        examples = [tasks.make_example(t, 256, s) for t in tasks.TASKS for s in (1, 2)]
        policy = Policy("page_entrokv", pages=4)
        solo = [worker.run_prompt(e, policy) for e in examples]
        decided = [None] * len(examples)
        consistent = []

        def run(i):
            def keep(kv, decisions):
                decided[i] = (kv, {int(f) for d in decisions for f in d.freed_frames})
            result = worker.run_prompt(examples[i], policy, on_decided=keep)
            stats = self.client.pool_stats(worker.model_id)  # after this sequence's close
            consistent.append(stats.used_frames + stats.free_frames == stats.capacity_frames)
            return result

        with concurrent.futures.ThreadPoolExecutor(4) as threads:
            together = list(threads.map(run, range(len(examples))))
        self.assertEqual(consistent, [True] * len(examples))
        for alone, concurrent_run in zip(solo, together):
            self.assertEqual(concurrent_run.answer, alone.answer)
            np.testing.assert_allclose(concurrent_run.logits, alone.logits, rtol=1e-6, atol=1e-6)
        seen = [kv.frames_seen for kv, _ in decided]
        self.assertGreater(sum(len(s) for s in seen), worker.pool.capacity_frames)
        reused = sum(len(freed & seen[j]) for i, (_, freed) in enumerate(decided)
                     for j in range(len(decided)) if j != i)
        self.assertGreater(reused, 0, "no frame evicted by one sequence served another")
        self.assertEqual(self.assert_pool_consistent(worker).used_frames, 0)

    def test_each_policy_is_given_the_statistic_the_registry_names(self):
        worker = self.worker("kinds", capacity_frames=256)
        kinds = {name: worker.kind(Policy(name, ratio=0.5)) for name in self.registry.names}
        self.assertEqual(kinds["h2o"], "accumulated")
        self.assertEqual(kinds["snapkv"], "window_mean")
        self.assertEqual(kinds["page_entrokv"], "last_row")
        self.assertEqual(kinds["streaming"], "last_row")  # scores none; the stream carries one
        self.assertEqual(worker.kind(Policy("h2o", ratio=0.5, statistic="last_row")), "last_row")
        # The worker reads the registry, not the name: another registry, another statistic.
        other = policies.parse('{"policies": [{"name": "h2o", "statistic": "window_mean", '
                               '"exact_budget": true}]}')
        stand_in = self.worker("kinds-other", registry=other, capacity_frames=256)
        self.assertEqual(stand_in.kind(Policy("h2o", ratio=0.5)), "window_mean")
        with self.assertRaisesRegex(ValueError, "'mean' is not one of h2o"):
            stand_in.kind(Policy("mean", ratio=0.5))

    def test_forks_share_the_prefill_and_decide_like_unforked_runs(self):
        worker = self.worker("forks", capacity_frames=2048)
        example = tasks.make_example("variable_tracking", 333, 4)  # a partial tail page
        # The expected-attention decision reads the prompt queries' statistics kept on the
        # parent (forks) or taken while its prefill runs (alone).
        policies = [Policy("none"), Policy("page_entrokv", ratio=0.75), Policy("h2o", pages=5),
                    Policy("snapkv", ratio=0.5), Policy("streaming", pages=4),
                    Policy("mean", ratio=0.75, statistic="keys_expected"),
                    Policy("mean", ratio=0.75, statistic="keys_expected_window"),
                    Policy("mean", ratio=0.75, statistic="keys_expected_r8"),
                    Policy("snapkv", ratio=0.75, allocator="mass")]
        forked = worker.run_forked(example, policies)
        self.assertEqual(self.assert_pool_consistent(worker).used_frames, 0)
        self.assertEqual([r.policy for r in forked], [p.label() for p in policies])
        for policy, fork in zip(policies, forked):
            with self.subTest(policy=policy.label()):
                alone = worker.run_prompt(example, policy)
                self.assertEqual(fork.answer, alone.answer)
                np.testing.assert_allclose(fork.logits, alone.logits, **TOLERANCE)
                self.assertEqual(fork.kept_frames, alone.kept_frames)
                self.assertEqual(fork.freed_frames, 0)  # every evicted page is the parent's too
        _, want = plain_logits(self.model, example.prompt, forked[0].answer)
        np.testing.assert_allclose(forked[0].logits, want, **TOLERANCE)
        self.assertEqual(forked[0].kept_frames, forked[0].prompt_frames)

    def test_a_low_rank_covariance_is_its_largest_directions(self):
        # keys_expected_r<p> sends a factor F [heads, p, head_dim] with F'F the covariance's best
        # rank-p approximation; p = head_dim would be the covariance itself.
        worker = self.worker("low-rank", capacity_frames=2048)
        c = self.model.config
        rng = np.random.default_rng(4)
        a = rng.standard_normal((c.query_heads, c.head_dim, c.head_dim))
        covariance = (a @ a.transpose(0, 2, 1) / c.head_dim).astype(np.float32)
        kv = pool_worker.PoolKV(worker, "unopened", 10)
        kv.moments = {"keys_expected_r8": {0: (np.zeros((c.query_heads, c.head_dim), np.float32),
                                               covariance)}}
        keys = worker._key_statistic(kv, "keys_expected_r8", 0, 10).keys
        self.assertEqual(len(keys.query_covariance), 0)
        factor = np.array(keys.query_covariance_factor).reshape(c.query_heads, 8, c.head_dim)
        values, vectors = np.linalg.eigh(covariance.astype(np.float64))
        best = np.einsum("hik,hk,hjk->hij", vectors[:, :, -8:], values[:, -8:],
                         vectors[:, :, -8:])
        np.testing.assert_allclose(factor.transpose(0, 2, 1) @ factor, best, rtol=1e-4,
                                   atol=1e-4)

    def test_the_default_spellings_are_the_client_s_default_policy(self):
        # What the evaluation measured as the default is what entrokv.default_policy asks for,
        # with entrokv.default_statistic's statistic (the worker builds it with that function).
        for setting, spelling in pool_worker.DEFAULT_SPELLINGS.items():
            with self.subTest(setting=setting):
                policy = pool_worker.policy_of(spelling, 0.75)
                self.assertEqual({"policy": policy.name, **dict(policy.params),
                                  "allocator": policy.allocator},
                                 entrokv.default_policy(setting == "question_in"))
                self.assertIn(policy.statistic, pool_worker.DEFAULT_KINDS)
                self.assertEqual(policy.statistic in pool_worker.MIXED_KINDS,
                                 setting == "question_in")

    def test_a_page_union_scores_each_page_by_its_better_rank(self):
        # Five pages. The question's rows (max-pooled over 7 tokens) rank page 2 first, page 4
        # second, then 0, 1, 3 (ties: the lower page first); expected attention (over 3) ranks
        # page 1, then 4, then 0, 2, 3. A page scores 1 / (1 + its better rank).
        worker = self.worker("page-union", capacity_frames=512)
        c, b = self.model.config, worker.page_size
        tokens = 5 * b
        rows = np.full((c.query_heads, tokens), 0.01)
        expected = np.full((c.query_heads, tokens), 0.01)
        rows[:, 2 * b + 3], rows[:, 4 * b + 8] = 1.0, 0.5
        expected[:, b + 5], expected[:, 4 * b + 1] = 1.0, 0.6
        worker.expected_attention = lambda kv, kind, layer, n: expected
        out = worker._page_union(None, 0, rows, tokens)
        page = np.repeat([1 / 3, 1, 1, 1 / 5, 1 / 2], b).astype(np.float32)
        np.testing.assert_allclose(out, np.tile(page, (c.query_heads, 1)), rtol=1e-6)
        # Through the daemon: every layer decided, fewer pages kept.
        del worker.expected_attention
        example = tasks.make_example("multi_key", 333, 6)
        kv, decisions = worker.prefill(
            example.prompt, policy=Policy("mean", ratio=0.75, statistic="window_expected_pages"))
        self.assertEqual(len(decisions), c.layers)
        self.assertLess((kv.tables >= 0).mean(), 0.5)
        worker.close_sequence(kv)

    def five_page_cover_worker(self, name: str):
        """A worker and zero question rows [query_heads, 5 pages] for the worker's own cover
        experiments; its expected attention is 1 on page 3's token 8, 0.6 on page 1's and 0.01
        on every other token."""
        worker = self.worker(name, capacity_frames=512)
        c, b = self.model.config, worker.page_size
        expected = np.full((c.query_heads, 5 * b), 0.01)
        expected[:, 3 * b + 8], expected[:, b + 8] = 1.0, 0.6
        worker.expected_attention = lambda kv, kind, layer, n: expected
        return worker, np.zeros((c.query_heads, 5 * b))

    def test_cover_by_the_mix_ranks_its_first_pages_by_the_average(self):
        # Five pages, the sink page 0 and the tail page 4 outside the span. The question's rows
        # put 0.6 on page 2 and 0.4 on page 3; expected attention puts 1 on page 3 and 0.6 on
        # page 1 (of 2.38 in all). The mix ranks page 3 first (0.2 + 0.21 against 0.3 + 0.002):
        # it holds 0.4 of the question's mass, so page 2 follows and the half is held. Expected
        # attention (over 3 tokens) orders the rest: page 1, then 0 and 4 (equal: the lower
        # first). A page scores 5 less its place. Ranked by the question alone, page 2 would
        # come first and hold the half by itself.
        worker, rows = self.five_page_cover_worker("cover-by-mix")
        c, b, tokens = self.model.config, worker.page_size, rows.shape[1]
        rows[:, 2 * b + 8], rows[:, 3 * b + 8] = 0.6, 0.4
        for width in pool_worker.COVER_MIX_WIDTHS:
            out = worker._cover_by_mix(None, f"window_expected_covermix{width}", 0, rows, tokens)
            page = np.repeat([2, 3, 4, 5, 1], b).astype(np.float32)
            np.testing.assert_array_equal(out, np.tile(page, (c.query_heads, 1)))

    def test_cover_then_mix_fills_the_quota_in_the_average_mixs_order(self):
        # Five pages, the sink page 0 and the tail page 4 outside the span. The question's rows
        # put 0.55 on page 2 and 0.45 on page 1, both on token 8; page 2 holds the half alone.
        # Expected attention (1 on page 3, 0.6 on page 1, of 2.38) would fill with page 3, then
        # 1; the mix ranks page 1 (0.225 + 0.126) above page 3 (0.21). Then pages 0 and 4 (equal:
        # the lower first). A page scores 5 less its place.
        worker, rows = self.five_page_cover_worker("cover-then-mix")
        c, b, tokens = self.model.config, worker.page_size, rows.shape[1]
        rows[:, b + 8], rows[:, 2 * b + 8] = 0.45, 0.55
        for width in pool_worker.COVER_FILL_WIDTHS:
            out = worker._cover_then_mix(None, f"window_expected_coverfill{width}", 0, rows,
                                         tokens)
            page = np.repeat([2, 4, 5, 3, 1], b).astype(np.float32)
            np.testing.assert_array_equal(out, np.tile(page, (c.query_heads, 1)))

    def test_cover_pooled_per_head_ranks_a_page_each_head_attends_to_first(self):
        # Five pages, the sink page 0 and the tail page 4 outside the span. In each group of
        # four heads, head h puts 0.5 on page 1's token 2 + h, and the first head 1.0 on page 2.
        # Pooled per head over 7 tokens (forward or centred), their mean is 0.5 on page 1 and
        # 0.25 on page 2: page 1 first, and it holds 0.5 of the question's 0.75, so the rest
        # follow expected attention's order (page 3, then 0, 2, 4). The mean pooled would rank
        # page 2 (0.25) above page 1 (0.125) and take both.
        worker, rows = self.five_page_cover_worker("cover-pooled-per-head")
        c, b, tokens = self.model.config, worker.page_size, rows.shape[1]
        per_group = c.query_heads // c.kv_heads
        for head in range(c.query_heads):
            rows[head, b + 2 + head % per_group] = 0.5
        rows[::per_group, 2 * b + 8] = 1.0
        for kind in pool_worker.COVER_HEAD_POOLS:
            out = worker._cover_pooled_per_head(None, kind, 0, rows, tokens)
            page = np.repeat([3, 5, 2, 4, 1], b).astype(np.float32)
            np.testing.assert_array_equal(out, np.tile(page, (c.query_heads, 1)))

    def test_the_layer_experiments_send_the_question_only_where_they_say(self):
        # Two groups of two heads: only2 sends every row on layer 2 and none elsewhere, skip2 the
        # reverse, only2g0 the first group's rows on layer 2 alone.
        rows = np.arange(1, 4 * 8 + 1, dtype=np.float32).reshape(4, 8)
        zeros = np.zeros_like(rows)
        sent = lambda kind, layer: pool_worker.question_rows_sent(  # noqa: E731
            f"window_expected_coverfwdsink50{kind}", layer, rows, 2)
        for layer in range(6):
            np.testing.assert_array_equal(sent("only2", layer), rows if layer == 2 else zeros)
            np.testing.assert_array_equal(sent("skip2", layer), zeros if layer == 2 else rows)
        np.testing.assert_array_equal(sent("only2g0", 2), np.vstack([rows[:2], zeros[2:]]))
        np.testing.assert_array_equal(sent("only2g0", 1), zeros)

    def test_cover_with_sinks_ranks_the_sink_page_by_the_question_without_its_sink_mass(self):
        # Five pages, the tail page 4 protected. The question's rows put 0.5 on the sink token 0
        # and 0.3 on page 0's token 8, 0.3 on page 2 and 0.2 on page 3: the sink token ranks
        # page 0 first, and its mass past the sink tokens is 0.3 of 0.8. Up to a share of 0.375
        # page 0 holds it alone; past it page 2 follows. Expected attention (1 on page 3, 0.6 on
        # page 1) orders the rest, equal pages the lower first. A page scores 5 less its place.
        # Counting the sink token's mass, page 0 would hold the half alone; without
        # cover_rank_sinks the daemon's cover ranks page 0 only among the keys' pages. This is
        # the reference the daemon's +winexpcoversink<c> is checked against
        # (test_a_keys_mix_decides_as_its_mix_sent_as_rows).
        c, b = self.model.config, 16  # pages of 16 tokens, the worker's default
        rows = np.zeros((c.query_heads, 5 * b), np.float32)
        rows[:, 0], rows[:, 8], rows[:, 2 * b + 8], rows[:, 3 * b + 8] = 0.5, 0.3, 0.3, 0.2
        expected = np.full((c.query_heads, 5 * b), 0.01, np.float32)
        expected[:, 3 * b + 8], expected[:, b + 8] = 1.0, 0.6
        for share in pool_worker.COVER_SINK_MASSES:
            mass, question_kernel, forward, rank_sinks = pool_worker.COVER[
                f"window_expected_coversink{share}"]
            out = cover_then_fill(rows, expected, c.query_heads // c.kv_heads, b, mass / 100,
                                  question_kernel, forward=forward, rank_sinks=rank_sinks)
            page = [5, 3, 2, 4, 1] if share <= 37.5 else [5, 2, 4, 3, 1]
            np.testing.assert_array_equal(
                out, np.tile(np.repeat(page, b).astype(np.float32), (c.query_heads, 1)))

    def test_expected_attention_pooled_by_the_worker_decides_as_the_daemon_pools_it(self):
        # keys_expected_w3l2w3 (the worker scores and pools, width 3 on every layer) keeps the
        # pages of the daemon's expected attention pooled over 3 (mean+expattn+nb3max); w3l2w5
        # the same pages on every layer but layer 2, and other pages there (at ratio 0.5 on
        # this prompt).
        example = tasks.make_example("multi_key", 333, 6)
        kept = {}
        for name in ("mean+expattn+nb3max", "mean+expattnw3l2w3", "mean+expattnw3l2w5"):
            worker = self.worker(f"layer-widths-{name.replace('+', '-')}", capacity_frames=2048)
            kv, _ = worker.prefill(example.prompt, policy=pool_worker.policy_of(name, 0.5))
            kept[name] = kv.tables >= 0
            worker.close_sequence(kv)
        daemon, same, wider = kept.values()
        self.assertLess(daemon.mean(), 0.5)  # pages were evicted
        np.testing.assert_array_equal(same, daemon)
        np.testing.assert_array_equal(np.delete(wider, 2, axis=0), np.delete(daemon, 2, axis=0))
        self.assertFalse((wider[2] == daemon[2]).all())

    def test_a_keys_mix_decides_as_its_mix_sent_as_rows(self):
        # window_expected(_k<w>|_max|_cover<c>) and window_keydiff send the window rows with a
        # keys mix: the daemon mixes them with its scores of the keys in the frames (w% on the
        # keys'; averaged, or each token's larger score; or the cover rule's order of pages).
        # The same mix computed here from the keys read back (the reference) and sent as rows
        # keeps the same pages.
        test = self
        c = self.model.config
        per_group = c.query_heads // c.kv_heads

        class Reference(pool_worker.PoolWorker):
            def _mixed(self, kv, kind, layer, rows, tokens):
                rule = kind
                if kind in pool_worker.COVER_LAYER_SETS:  # the default's rule on the rows sent
                    rows = pool_worker.question_rows_sent(kind, layer, rows, per_group)
                    rule = pool_worker.DEFAULT_KINDS[0]
                if pool_worker.MIXED_RULES[rule] == "cover":
                    expected = self.expected_attention(kv, kind, layer, tokens)
                    mass, question_kernel, forward, rank_sinks = pool_worker.COVER[rule]
                    return cover_then_fill(rows, expected, per_group, self.page_size,
                                           mass / 100, question_kernel, forward=forward,
                                           rank_sinks=rank_sinks)
                out = rows.astype(np.float64)
                out /= np.maximum(out.sum(axis=1, keepdims=True), 1e-30)
                pages = -(-tokens // self.page_size)
                # The worker's own expected attention, checked here against the daemon's.
                expected = (self.expected_attention(kv, kind, layer, tokens)
                            if MIXED_KINDS[kind] == "expected_attention" else None)
                for g in range(c.kv_heads):
                    group = slice(g * per_group, (g + 1) * per_group)
                    if expected is None:  # keydiff
                        k, _ = self.arena.load(kv.tables[layer, g, :pages], self.arena.slot(g),
                                               None)
                        unit = k[:tokens].astype(np.float64)
                        unit /= np.linalg.norm(unit, axis=1)[:, None]
                        anchor = unit.mean(axis=0)
                        score = 1.0 - unit @ (anchor / np.linalg.norm(anchor))
                    else:
                        score = expected[group]
                    score = score / score.sum(axis=-1, keepdims=True)
                    weight = pool_worker.MIXED_WEIGHTS[kind]
                    if pool_worker.MIXED_RULES[kind] == "max":
                        out[group] = np.maximum((1.0 - weight) * out[group], weight * score)
                    else:
                        out[group] = (1.0 - weight) * out[group] + weight * score
                return out.astype(np.float32)

        MIXED_KINDS = {k: v for k, v in pool_worker.MIXED_KINDS.items()
                       if k not in pool_worker.WORKER_MIXES}
        example = tasks.make_example("multi_key", 333, 6)
        for kind in MIXED_KINDS:
            with self.subTest(kind=kind):
                kept = []
                for worker_class in (pool_worker.PoolWorker, Reference):
                    worker = worker_class(self.client, self.model, self.registry,
                                          model_id=f"mixed-{kind}-{worker_class.__name__}",
                                          capacity_frames=2048)
                    self.addCleanup(worker.close, unregister=True)
                    kv, decisions = worker.prefill(
                        example.prompt, policy=Policy("mean", ratio=0.75, statistic=kind))
                    test.assertEqual(len(decisions), c.layers)
                    kept.append(kv.tables >= 0)
                    worker.close_sequence(kv)
                self.assertLess(kept[0].mean(), 0.5)  # pages were evicted
                np.testing.assert_array_equal(kept[0], kept[1])

    def test_question_excluded_decides_the_context_before_the_question(self):
        worker = self.worker("no-question", capacity_frames=2048)
        example = tasks.make_example("multi_key", 333, 6)
        window = pool_worker.question_window(example.prompt)
        context_pages = -(-(len(example.prompt) - window) // worker.page_size)
        policies = [Policy("none"), Policy("page_entrokv", pages=6), Policy("snapkv", pages=6)]
        excluded = worker.run_forked(example, policies, question_excluded=True)
        self.assertEqual(self.assert_pool_consistent(worker).used_frames, 0)
        # No eviction: the context and then the question give the whole prompt's answer.
        included = worker.run_forked(example, policies[:1])
        self.assertEqual(excluded[0].answer, included[0].answer)
        np.testing.assert_allclose(excluded[0].logits, included[0].logits, **TOLERANCE)
        self.assertEqual(excluded[0].prompt_frames, context_pages * self.model.config.kv_heads
                         * self.model.config.layers)
        for result in excluded[1:]:
            with self.subTest(policy=result.policy):
                # The decision kept 6 of the context's pages per (layer, group), and the
                # question's tokens were written after it (into the kept partial page, copied,
                # and pages on top).
                total_pages = -(-(len(example.prompt) + len(result.answer)) // worker.page_size)
                added = total_pages - context_pages + 1  # the partial context page, copied
                self.assertLessEqual(result.kept_frames, (6 + added) * self.model.config.kv_heads
                                     * self.model.config.layers)
                self.assertGreaterEqual(result.kept_frames, 6 * self.model.config.kv_heads
                                        * self.model.config.layers)
        # The decision saw no question row: with the whole prompt's last row it keeps other
        # pages (the question attends to the needle; the context's last token does not).
        with_question = worker.run_forked(example, policies[1:2])[0]
        self.assertNotEqual([d.groups[0].kept_pages.tolist() for d in with_question.decisions],
                            [d.groups[0].kept_pages.tolist() for d in excluded[1].decisions])

    def test_rejected_speculative_tokens_leave_no_trace(self):
        # Speculative decoding: k draft tokens are appended and run through the model in one
        # step (the verification), the last j are rejected and truncated, and greedy decoding
        # goes on. The answer and every logit equal a run that never appended the rejected
        # drafts (token by token: the verification's batched rows agree to float32 rounding),
        # with the frames the truncation freed, and the rolled-back slots of the kept tail page,
        # poisoned. A decision before the drafts (evicted pages stay evicted) and a fork whose
        # shared tail the drafts copy (the parent is untouched) are covered too.
        steps = 14  # more than any k below
        example = tasks.make_example("multi_key", 250, 3)  # 15 pages and 10 tokens
        vocab = self.model.config.vocab
        for policy, forked in ((Policy("page_entrokv", pages=5), False), (Policy("none"), True)):
            worker = self.worker(f"speculative-{policy.name}", capacity_frames=1024)

            def start():
                if not forked:
                    return worker.prefill(example.prompt, policy=policy)[0], None
                parent, _ = worker.prefill(example.prompt, kinds=("last_row",))
                return worker.fork(parent), parent

            kv, parent = start()
            want_answer, want_logits = worker.decode(kv, max_new=steps, eos=-1)
            worker.close_sequence(kv)
            if parent is not None:
                worker.close_sequence(parent)
            # (k, j): within the tail page, across one page edge, everything rejected, and
            # back across the edge the drafts crossed.
            for k, j in ((4, 2), (9, 3), (7, 7), (12, 11)):
                with self.subTest(policy=policy.label(), forked=forked, k=k, j=j):
                    kv, parent = start()
                    tables_before = kv.tables.copy()
                    accepted = k - j
                    draft = want_answer[:accepted] + [
                        (want_answer[accepted + i] + 1 + i) % vocab for i in range(j)]
                    position = kv.length
                    worker.append(kv, k)
                    rows = worker.model.step(np.array(draft), np.arange(position, position + k),
                                             kv)
                    used = self.assert_pool_consistent(worker).used_frames
                    freed = worker.truncate(kv, j)
                    self.assertEqual(kv.length, position + accepted)
                    # The pages only the rejected drafts reached are freed in every (layer,
                    # group); the page that is the tail again keeps its frame.
                    b = worker.page_size
                    dropped = -(-(position + k) // b) - -(-(position + accepted) // b)
                    self.assertEqual(freed, dropped * LAYERS * GROUPS)
                    self.assertEqual(self.assert_pool_consistent(worker).used_frames,
                                     used - freed)
                    # Poison what the rolled-back drafts left: every free frame, and the slots
                    # past the new end of each kept tail page.
                    live = {int(f) for s in self.client.list_sequences(
                                worker.model_id, block_tables=True)
                            for t in s.block_tables for f in t.frames if f >= 0}
                    worker.arena.frames[sorted(set(range(worker.pool.capacity_frames)) -
                                               live)] = np.nan
                    tail_page, tail_slot = divmod(kv.length, b)
                    if tail_slot:
                        tails = kv.tables[:, :, tail_page]
                        worker.arena.frames[tails[tails >= 0], :, :, tail_slot:] = np.nan
                    # The pages before the drafts keep their frames (evicted ones stay evicted).
                    pages = -(-position // b)
                    np.testing.assert_array_equal(kv.tables[:, :, :pages - 1],
                                                  tables_before[:, :, :pages - 1])
                    np.testing.assert_allclose(rows[:accepted], want_logits[1:1 + accepted],
                                               **TOLERANCE)
                    # Greedy decoding resumes after the last accepted token.
                    last = rows[accepted - 1] if accepted else kv.prefill_logits[-1]
                    answer, logits = list(draft[:accepted]), [last]
                    token = int(np.argmax(last))
                    while len(answer) < steps:
                        answer.append(token)
                        at = kv.length
                        worker.append(kv, 1)
                        logits.append(worker.model.step(np.array([token]), np.array([at]),
                                                        kv)[-1])
                        token = int(np.argmax(logits[-1]))
                    self.assertEqual(answer, want_answer)
                    np.testing.assert_allclose(np.stack(logits), want_logits[accepted:],
                                               **TOLERANCE)
                    if parent is not None:
                        # The parent's shared pages still hold the prompt: its decode is the
                        # same as the child's reference.
                        parent_answer, parent_logits = worker.decode(parent, max_new=steps,
                                                                     eos=-1)
                        self.assertEqual(parent_answer, want_answer)
                        np.testing.assert_allclose(parent_logits, want_logits, **TOLERANCE)
                        worker.close_sequence(parent)
                    worker.close_sequence(kv)
                    stats = self.assert_pool_consistent(worker)
                    self.assertEqual(stats.used_frames, 0)

    def test_command_prints_accuracy_and_frames(self):
        with tempfile.TemporaryDirectory() as tmp:
            weights = os.path.join(tmp, "w.npz")
            config = numpy_model.Config()
            np.savez(weights, config_json=np.array(
                '{"vocab": 128, "d_model": 128, "layers": 4, "query_heads": 8, "kv_heads": 2, '
                '"head_dim": 32, "mlp_hidden": 384}'), **self.model.w)
            self.assertEqual(numpy_model.Model.load(weights).config, config)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = pool_worker.main(["--server", self.daemon.address, "--weights", weights,
                                         "--entrokv", os.environ["ENTROKV_CLI"], "--prompts", "3",
                                         "--length", "200", "--tasks", "single_needle,multi_key",
                                         "--ratio", "0.5", "--layer-quotas", "--policies",
                                         "page_entrokv,mean,mean+expattn+nb3max+pyramid"])
        self.assertEqual(code, 0)
        text = out.getvalue()
        for label in ("none", "page_entrokv@0.5", "mean@0.5",
                      r"mean\+expattn\+nb3max\+pyramid@0.5"):
            self.assertRegex(text, rf"\n{label} +\d+/3 +\d+ +[\d.]+%")
        self.assertRegex(text, r"pool after every close: 0 used \+ \d+ free = \d+ frames")
        # Pages per layer: half of 200 tokens x 4 layers is 25 pages of 16 tokens, 7 to the
        # lowest layer by largest remainder; the pyramid's more in lower layers.
        self.assertRegex(text, r"\nmean@0.5 +7\.0 +6\.0 +6\.0 +6\.0\n")
        pyramid = re.search(r"\nmean\+expattn\+nb3max\+pyramid@0.5 +([\d. ]+)\n", text)
        quotas = [float(q) for q in pyramid.group(1).split()]
        self.assertEqual(quotas, sorted(quotas, reverse=True))
        self.assertAlmostEqual(sum(quotas), 25)


if __name__ == "__main__":
    unittest.main()
