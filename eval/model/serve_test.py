"""Serving under pool pressure (serve.py) against a real entrokvd on loopback, with the trained
model (eval/model/weights.npz). ENTROKVD names the daemon binary, ENTROKV_CLI the CLI and
PYTHONPATH holds the built client package (ctest sets all three)."""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import policies  # noqa: E402
import tasks  # noqa: E402

try:
    import entrokv  # noqa: E402
    import pool_worker  # noqa: E402
    import serve  # noqa: E402
except ImportError:  # the client package is not on the path: run through ctest
    entrokv = None

WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights.npz")


@unittest.skipIf(entrokv is None or "ENTROKVD" not in os.environ or
                 "ENTROKV_CLI" not in os.environ,
                 "needs ENTROKVD, ENTROKV_CLI and the client package on PYTHONPATH (run through "
                 "ctest)")
class ServeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.registry = policies.load(os.environ["ENTROKV_CLI"])
        cls.daemon = pool_worker.LocalDaemon(os.environ["ENTROKVD"], "--max_swap_bytes=67108864")
        cls.client = entrokv.Client(cls.daemon.address, timeout_s=60)
        cls.model = numpy_model.Model.load(WEIGHTS)
        cls.cache = serve.PrefillCache(cls.model)
        # Short prompts keep the test quick; the pool then holds a quarter of what is offered.
        cls.requests = serve.workload(10, rate=2.0, seed=5, lengths=[256, 384])
        offered = serve.offered_frames(cls.requests, 2.0, cls.model.config, 16)
        cls.pool = int(np.ceil(0.25 * offered))

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        code = cls.daemon.stop()
        if code != 0:
            raise AssertionError(f"entrokvd exited with {code} after SIGTERM")

    def run_strategy(self, strategy, poison=False, pool=None, fraction=None):
        serving = serve.Serving(self.client, self.model, self.registry, self.cache, strategy,
                                0.25, pool or self.pool, floor=0.1, prefill_tokens=1024,
                                poison=poison, max_steps=400, fraction=fraction)
        try:
            result = serving.run(self.requests)
            stats = self.client.pool_stats(serving.model_id)
        finally:
            serving.close()
        self.assertEqual(result.unfinished, 0, f"{strategy}: requests left unfinished")
        self.assertEqual(stats.used_frames, 0)
        self.assertEqual(stats.used_frames + stats.free_frames, stats.capacity_frames)
        return result, stats

    def test_workload_is_a_function_of_the_seed(self):
        a = serve.workload(6, 1.5, 3, [256, 512])
        b = serve.workload(6, 1.5, 3, [256, 512])
        self.assertEqual([r.arrival for r in a], [r.arrival for r in b])
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.example.prompt, y.example.prompt)
        self.assertEqual([r.example.task for r in a], list(tasks.TASKS) + list(tasks.TASKS[:2]))
        self.assertNotEqual([r.key for r in a], [r.key for r in serve.workload(6, 1.5, 4, [256])])
        self.assertEqual(sorted(r.arrival for r in a), [r.arrival for r in a])

    # The safety of reclaimed frames, with the real model: a quota is applied only at its
    # owner's own call, which reports the pages; every frame no sequence names (the reclaimed
    # ones among them) is poisoned after every call that frees frames, and every answer and
    # every logit of every request is what the unpoisoned run computes.
    def test_reclaimed_frames_are_never_read(self):
        clean, _ = self.run_strategy("manager")
        dirty, stats = self.run_strategy("manager", poison=True)
        self.assertGreater(stats.frames_reclaimed_admission_total +
                           stats.frames_reclaimed_target_total, 0,
                           "no quota took a frame: the check proves nothing")
        self.assertGreater(stats.admissions_delayed_total, 0)
        for a, b in zip(clean.states, dirty.states):
            self.assertEqual(a.out, b.out, f"request {a.request.index}")
            self.assertEqual(len(a.logits), len(b.logits))
            for row_a, row_b in zip(a.logits, b.logits):
                np.testing.assert_array_equal(row_a, row_b)
                self.assertTrue(np.all(np.isfinite(row_b)))

    def test_paired_counts_the_requests_only_one_side_answered(self):
        # Five requests at one share: a alone answers 0 and 1, b alone answers 2, both answer
        # 3; request 4 did not finish under b, so it is not paired.
        rows = []
        for strategy, correct, done in (("a", [1, 1, 0, 1, 1], [9] * 5),
                                        ("b", [0, 0, 1, 1, 1], [9, 9, 9, 9, None])):
            rows += [{"strategy": strategy, "pool_share": 0.5, "request": i,
                      "correct": c, "done": d} for i, (c, d) in enumerate(zip(correct, done))]
        (row,) = serve.paired(rows, "a", "b")
        self.assertEqual((row["requests"], row["a_correct"], row["b_correct"]), (4, 3, 2))
        self.assertEqual((row["a_only"], row["b_only"]), (2, 1))
        self.assertEqual(row["p"], 1.0)  # 2 against 1 discordant: exact McNemar p = 1

    def test_poison_in_a_frame_a_sequence_keeps_is_seen(self):
        # The control: poisoning frames the sequences still name reaches the logits, so the
        # unchanged logits above mean the reclaimed frames were not read.
        serving = serve.Serving(self.client, self.model, self.registry, self.cache, "manager",
                                0.25, self.pool, floor=0.1, prefill_tokens=1024, max_steps=400)
        try:
            original = serving._poison

            def poison_live():
                for s in self.client.list_sequences(serving.model_id, block_tables=True):
                    for t in s.block_tables:
                        live = t.frames[t.frames >= 0]
                        serving.worker.arena.frames[live] = np.nan
            serving.poison = True
            serving._poison = poison_live
            result = serving.run(self.requests[:2])
            del original
        finally:
            serving.close()
        self.assertTrue(any(not np.all(np.isfinite(row)) for s in result.states
                            for row in s.logits[1:]))

    def test_every_strategy_finishes_every_request(self):
        results = {s: self.run_strategy(s)[0] for s in serve.STRATEGIES if s != "fixed_matched"}
        summary = {s: serve.summarize(r, self.model.config, 16) for s, r in results.items()}
        # fixed at the manager's mean frames: the fixed fraction scaled by their ratio.
        fraction = serve.matched_fraction(list(summary.values()), 0.25)
        self.assertAlmostEqual(fraction, min(1.0, 0.25 * summary["manager"]["mean_used_frames"] /
                                             summary["fixed"]["mean_used_frames"]))
        results["fixed_matched"] = self.run_strategy("fixed_matched", fraction=fraction)[0]
        summary["fixed_matched"] = serve.summarize(results["fixed_matched"], self.model.config, 16)
        self.assertEqual(summary["fixed_matched"]["fixed_fraction"], round(fraction, 4))
        for strategy, row in summary.items():
            self.assertEqual(row["completed"], len(self.requests), strategy)
            self.assertLessEqual(row["peak_used_frames"], self.pool, strategy)
        # No eviction: fcfs and recompute keep every page; the others keep less.
        self.assertEqual(summary["fcfs"]["mean_kept_share"], 1.0)
        self.assertLess(summary["fixed"]["mean_kept_share"], 0.5)
        # Preempted by swapping, a request is swapped out (and resumed) rather than closed.
        self.assertEqual(results["manager_swap"].preemptions, results["manager_swap"].swaps)
        # Greedy answers without eviction do not depend on the schedule.
        for a, b in zip(results["fcfs"].states, results["recompute"].states):
            self.assertEqual(a.out, b.out)


if __name__ == "__main__":
    unittest.main()
