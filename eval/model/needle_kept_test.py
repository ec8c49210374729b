"""needle_kept.py against a real entrokvd on loopback: the needle pages it counts are the ones the
fork's decisions left, and its report names the prompts two policies disagree on."""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402

try:
    import needle_kept  # noqa: E402
    import pool_worker  # noqa: E402
    from pool_worker import Policy  # noqa: E402
    from pool_worker_test import DaemonFixture  # noqa: E402
except ImportError:  # the client package is not on the path: run through ctest
    needle_kept = None
    DaemonFixture = object


@unittest.skipIf(needle_kept is None or "ENTROKVD" not in os.environ or
                 "ENTROKV_CLI" not in os.environ,
                 "needs ENTROKVD, ENTROKV_CLI and the client package on PYTHONPATH (run through "
                 "ctest)")
class NeedleKeptTest(DaemonFixture, unittest.TestCase):
    def test_the_pages_counted_are_those_the_decisions_left(self):
        worker = pool_worker.PoolWorker(self.client, self.model, self.registry,
                                        model_id="needle-kept")
        self.addCleanup(worker.close, unregister=True)
        example = tasks.make_example("single_needle", 512, 3, 0.5)  # the needle mid-prompt
        (begin, end), = example.needle_spans
        # streaming keeps the first and the last pages only: a mid-prompt needle is gone from
        # every (layer, group) once it has decided, and whole everywhere without eviction.
        policies = [Policy("none"), Policy("streaming", pages=2), Policy("snapkv", ratio=0.5)]
        none, streaming, snapkv = needle_kept.measure(worker, example, policies, False)
        c = self.model.config
        self.assertEqual(none["kept"].shape, (1, c.layers, c.kv_heads))
        self.assertTrue(none["kept"].all())
        self.assertFalse(streaming["kept"].any())
        self.assertEqual(none["needle_pages"], (end - 1) // 16 - begin // 16 + 1)
        self.assertLess(snapkv["frames"], none["frames"])
        # The question excluded: decided before the question, the same counting.
        _, streaming_excluded, _ = needle_kept.measure(worker, example, policies, True)
        self.assertFalse(streaming_excluded["kept"].any())

    def test_the_report_lists_the_prompts_the_first_two_disagree_on(self):
        def row(correct, kept, pages=({1, 2},)):
            return {"correct": correct, "kept": np.array(kept, bool).reshape(1, 2, 1),
                    "frames": 4, "needle_pages": 2, "needles": [[2, 3]],
                    "pages": [[set(p) for p in pages]] * 2}
        rows = [[row(True, [1, 1]), row(True, [1, 0])],
                [row(False, [0, 0]), row(True, [1, 0])],
                [row(True, [1, 1]), row(False, [0, 0])]]
        text = needle_kept.report(["a", "b"], rows, "a cell")
        self.assertIn("| a | 2 / 3 | 4.0 | 66.7% | 66.7% | 66.7% |", text)
        self.assertIn("| b | 2 / 3 | 4.0 | 33.3% | 66.7% | 0.0% |", text)
        disagreements = text.split("disagree")[1]
        self.assertIn("| 1 | 2 | b | 0.0% | 50.0% |", disagreements)
        self.assertIn("| 2 | 2 | a | 100.0% | 0.0% |", disagreements)
        self.assertNotIn("| 0 |", disagreements)
        # With a layer: the pages of that layer only one of the two keeps, a needle's named.
        rows[1][1] = row(True, [1, 0], ({1, 3}, {5}))
        rows[1][0] = row(False, [0, 0], ({1, 2}, {5}))
        text = needle_kept.report(["a", "b"], rows, "a cell", layer=1)
        self.assertIn("| 1 | 2 | b | 0.0% | 50.0% | g0: 2(n1) / 3(n1) |", text)
        self.assertIn("| 2 | 2 | a | 100.0% | 0.0% | the same |", text)


if __name__ == "__main__":
    unittest.main()
