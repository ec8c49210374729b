"""The tensor-parallel pool worker (TP = 2, a process per rank) against the one-rank pool worker,
both on a real entrokvd on loopback (started here with two host devices, stopped by SIGTERM).

The committed weights (eval/model/weights.npz) and one prompt of each task: the TP = 2 run's
greedy answers and kept pages equal the TP = 1 run's (LAYER layout, the daemon's layer scope, the
same policy and budget), with no eviction and with page_entrokv keeping 25%; both ranks get the
same decision; nothing stays in the pool after the closes. In the GROUP layout too: each rank's
frames are its own and each rank decides its group alone, and the answers, the pages every
group keeps and the frames kept equal the one-rank GROUP worker's. Splitting the matmuls changes the
floats a little, so answers and pages are compared, and the logits only to a tolerance. A
driver whose all-reduce drops rank 1's partial must answer otherwise (the check can fail).
ENTROKVD, ENTROKV_CLI and the client package on PYTHONPATH come from ctest.
"""
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
    import tp_worker  # noqa: E402
    from pool_worker import Policy  # noqa: E402
except ImportError:  # the client package is not on the path: run through ctest
    entrokv = None

WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights.npz")
LENGTH = 384
POLICIES = (Policy("none"), Policy("page_entrokv", ratio=0.75))


@unittest.skipIf(entrokv is None or "ENTROKVD" not in os.environ or
                 "ENTROKV_CLI" not in os.environ,
                 "needs ENTROKVD, ENTROKV_CLI and the client package on PYTHONPATH (run through "
                 "ctest)")
class TensorParallelWorkerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.registry = policies.load(os.environ["ENTROKV_CLI"])
        cls.model = numpy_model.Model.load(WEIGHTS)
        cls.examples = [tasks.make_example(task, LENGTH, 3) for task in tasks.TASKS]
        cls.daemon = pool_worker.LocalDaemon(os.environ["ENTROKVD"], "--host_devices=2")
        try:
            cls.client = entrokv.Client(cls.daemon.address, timeout_s=60)
            cls.single = pool_worker.PoolWorker(cls.client, cls.model, cls.registry,
                                                model_id="tp1-layer", frame_layout="layer",
                                                capacity_frames=1024)
            cls.driver = tp_worker.TPDriver(cls.daemon.address, cls.model, cls.registry,
                                            tensor_parallel_size=2, model_id="tp2-layer",
                                            capacity_frames=1024)
            groups = cls.model.config.kv_heads
            cls.single_group = pool_worker.PoolWorker(cls.client, cls.model, cls.registry,
                                                      model_id="tp1-group", frame_layout="group",
                                                      capacity_frames=1024 * groups)
            cls.group_driver = tp_worker.TPDriver(cls.daemon.address, cls.model, cls.registry,
                                                  tensor_parallel_size=2, model_id="tp2-group",
                                                  capacity_frames=1024, frame_layout="group")
            # The one-rank runs every test compares with.
            cls.reference = {(p.label(), e.task): cls.single.run_prompt(e, p)
                             for p in POLICIES for e in cls.examples}
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for name, close in (("driver", lambda d: d.close()),
                            ("group_driver", lambda d: d.close()),
                            ("single", lambda w: w.close(unregister=True)),
                            ("single_group", lambda w: w.close(unregister=True)),
                            ("client", lambda c: c.close())):
            if hasattr(cls, name):
                close(getattr(cls, name))
        code = cls.daemon.stop()
        if code != 0:
            raise AssertionError(f"entrokvd exited with {code} after SIGTERM")

    def test_the_daemon_gives_an_arena_per_rank(self):
        pool = self.driver.pool
        self.assertEqual(len(pool.ranks), 2)
        self.assertNotEqual(pool.ranks[0].arena_name, pool.ranks[1].arena_name)
        self.assertEqual([r.frame_bytes * 2 for r in pool.ranks], [pool.frame_bytes] * 2)
        # A rank holds only its shard: the wq rows of its 4 heads, the wk/wv rows of its group,
        # the wo columns of its heads; the driver holds no attention weights.
        config, weights = tp_worker.rank_weights(self.model, 1, 2)
        self.assertEqual((config.query_heads, config.kv_heads), (4, 1))
        self.assertEqual(weights["layers.0.wq.weight"].shape, (4 * 32, 128))
        self.assertEqual(weights["layers.0.wk.weight"].shape, (32, 128))
        self.assertEqual(weights["layers.0.wo.weight"].shape, (128, 4 * 32))
        self.assertNotIn("layers.0.wq.weight", self.driver.model.w)

    def test_answers_and_pages_equal_the_one_rank_worker(self):
        for policy in POLICIES:
            for example in self.examples:
                with self.subTest(policy=policy.label(), task=example.task):
                    one = self.reference[(policy.label(), example.task)]
                    tp = self.driver.run_prompt(example, policy)
                    self.assertEqual(tp.answer, one.answer)
                    self.assertEqual(tp.kept_frames, one.kept_frames)
                    # Splitting wo's matmul over the ranks reorders float32 sums only (1e-5 seen).
                    np.testing.assert_allclose(tp.logits, one.logits, rtol=1e-4, atol=1e-4)
                    if policy.name == "none":
                        self.assertEqual(tp.kept_pages, [[], []])
                        self.assertTrue(np.all(tp.tables >= 0))
                        continue
                    # Both ranks got the decision, the same one, and it is the one-rank one.
                    want = [[g.kept_pages for g in d.groups] for d in one.decisions]
                    for rank in (0, 1):
                        self.assertEqual(len(tp.kept_pages[rank]), len(want))
                        for got, expected in zip(tp.kept_pages[rank], want):
                            self.assertEqual(len(got), len(expected))
                            for g, e in zip(got, expected):
                                np.testing.assert_array_equal(g, e)
                    # The tables every rank attends through name exactly the kept pages.
                    for layer, groups in enumerate(tp.kept_pages[0]):
                        for group in range(tp.tables.shape[1]):
                            kept = groups[group] if len(groups) > 1 else groups[0]
                            np.testing.assert_array_equal(
                                np.flatnonzero(tp.tables[layer, group] >= 0), kept)
                    self.assertLess(tp.kept_frames, 0.3 * LENGTH / 16 * self.model.config.layers)
        stats = self.client.pool_stats(self.driver.model_id)
        self.assertEqual(stats.used_frames, 0)
        self.assertEqual(stats.used_frames + stats.free_frames, stats.capacity_frames)

    def test_group_layout_ranks_decide_alone_and_answer_as_one_rank(self):
        pool = self.group_driver.pool
        self.assertEqual(pool.frame_layout, "group")
        frames = pool.capacity_frames // 2
        self.assertEqual([(r.first_frame, r.frames) for r in pool.ranks],
                         [(0, frames), (frames, frames)])
        for policy in POLICIES:
            for example in self.examples:
                with self.subTest(policy=policy.label(), task=example.task):
                    one = self.single_group.run_prompt(example, policy)
                    tp = self.group_driver.run_prompt(example, policy)
                    self.assertEqual(tp.answer, one.answer)
                    self.assertEqual(tp.kept_frames, one.kept_frames)
                    np.testing.assert_allclose(tp.logits, one.logits, rtol=1e-4, atol=1e-4)
                    # Group g's frames lie in rank g's arena.
                    for group in (0, 1):
                        named = tp.tables[:, group][tp.tables[:, group] >= 0]
                        self.assertTrue(np.all(named // frames == group), named)
                    if policy.name == "none":
                        self.assertTrue(np.all(tp.tables >= 0))
                        continue
                    # Rank r decided its group alone, as the one-rank worker decided it.
                    for rank in (0, 1):
                        for got, decision in zip(tp.kept_pages[rank], one.decisions):
                            self.assertEqual(len(got), 1)
                            np.testing.assert_array_equal(got[0],
                                                          decision.groups[rank].kept_pages)
                            np.testing.assert_array_equal(
                                np.flatnonzero(tp.tables[decision.layer, rank] >= 0), got[0])
        stats = self.client.pool_stats(self.group_driver.model_id)
        self.assertEqual(stats.used_frames, 0)

    def test_an_all_reduce_without_rank_1_answers_otherwise(self):
        # The negative control: the comparison above can fail.
        policy = POLICIES[0]
        differ = 0
        for example in self.examples:
            broken = self.driver.run_prompt(example, policy, ranks_used=[0])
            differ += broken.answer != self.reference[(policy.label(), example.task)].answer
        self.assertGreater(differ, 0)

    def test_a_size_that_does_not_divide_the_groups_is_refused(self):
        with self.assertRaisesRegex(ValueError, "tensor_parallel_size 3"):
            tp_worker.TPDriver(self.daemon.address, self.model, self.registry,
                               tensor_parallel_size=3, model_id="tp3")


if __name__ == "__main__":
    unittest.main()
