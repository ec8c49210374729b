"""cover_quota.py against a real entrokvd on loopback: the cover pages it computes are the ones
the daemon's decisions keep first, and its report reads its counts."""
import contextlib
import io
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402

try:
    import cover_quota  # noqa: E402
    import pool_worker  # noqa: E402
    from pool_worker_test import DaemonFixture  # noqa: E402
except ImportError:  # the client package is not on the path: run through ctest
    cover_quota = None
    DaemonFixture = object


@unittest.skipIf(cover_quota is None or "ENTROKVD" not in os.environ or
                 "ENTROKV_CLI" not in os.environ,
                 "needs ENTROKVD, ENTROKV_CLI and the client package on PYTHONPATH (run through "
                 "ctest)")
class CoverQuotaTest(DaemonFixture, unittest.TestCase):
    def test_the_daemon_keeps_the_cover_first_then_the_keys_pages(self):
        worker = pool_worker.PoolWorker(self.client, self.model, self.registry,
                                        model_id="cover-quota")
        self.addCleanup(worker.close, unregister=True)
        example = tasks.make_example("multi_key", 512, 5, 0.5)
        spelling = pool_worker.DEFAULT_SPELLINGS["question_in"]
        filled = shared = 0
        for counts in cover_quota.measure(worker, example, spelling, [0.25, 0.95]):
            for quota, cover, question, keys in counts.reshape(-1, 4):
                # Every kept page is the tail, the question's or the keys'.
                self.assertEqual(question + keys + 1, quota)
                if cover >= quota - 1:  # the cover fills the quota: its first pages, no keys'
                    self.assertEqual((question, keys), (quota - 1, 0))
                    filled += 1
                else:  # the whole cover, then the keys' pages
                    self.assertEqual(question, cover)
                    shared += 1
        self.assertGreater(filled, 0)
        self.assertGreater(shared, 0)

    def test_a_spelling_without_the_cover_rule_is_refused(self):
        error = io.StringIO()
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(error):
            cover_quota.main(["--weights", "unused", "--entrokvd", os.environ["ENTROKVD"],
                              "--entrokv", os.environ["ENTROKV_CLI"], "--cells",
                              "multi_key:512", "--ratios", "0.5", "--seed", "1",
                              "--policy", "mean+winexp+nb3max+pyramid"])
        self.assertIn("--policy: mean+winexp+nb3max+pyramid is not a cover spelling",
                      error.getvalue())


class CoverQuotaReportTest(unittest.TestCase):
    @unittest.skipIf(cover_quota is None, "needs the client package on PYTHONPATH")
    def test_the_report_reads_the_counts(self):
        # Two prompts, one layer, two groups: (quota, cover length, question's, keys').
        counts = np.array([[[[5, 9, 4, 0], [5, 2, 2, 2]]],
                           [[[5, 7, 4, 0], [5, 3, 3, 1]]]])
        text = cover_quota.report("p", [("multi_key", 1024)], [0.9],
                                  {("multi_key", 1024, 0.9): counts}, "a header")
        self.assertIn("## multi_key, 1024 tokens, ratio 0.9 (2 prompts)", text)
        self.assertIn("| 0 | 5 | 5 | 3.2 | 0.8 | 50% |", text)

    @unittest.skipIf(cover_quota is None, "needs the client package on PYTHONPATH")
    def test_the_cover_holds_the_kinds_share_of_the_mass(self):
        # 8 pages of 16 tokens, the tail page (7) outside the span: three peaks (pages 5, 2, 6)
        # on a thin spread, and a sink token (2) high enough to rank page 0 first.
        row = np.full(128, 0.35 / 105, np.float32)
        row[:4], row[2] = 0.0, 0.9
        row[80], row[40], row[100] = 0.3, 0.2, 0.15
        rows = np.stack([row, row])
        cover = {share: cover_quota.question_cover(
            rows, 2, 16, f"window_expected_coverfwdsink{share}")[0] for share in (25, 50)}
        # Page 0 holds its 12 non-sink tokens' mass (the sinks' is left out); page 5 then makes
        # 0.39 of the mass, page 2 0.64.
        self.assertEqual(cover, {25: {0, 5}, 50: {0, 5, 2}})
        # Without the sink pages ranked, the span starts at page 1; pooled centred, the peak on
        # page 5's first token ranks page 4 with it (first: ties go to the lower page).
        self.assertEqual(cover_quota.question_cover(rows, 2, 16, "window_expected_cover50")[0],
                         {4, 5, 2})

    @unittest.skipIf(cover_quota is None, "needs the client package on PYTHONPATH")
    def test_split_kept_leaves_the_tail_out(self):
        self.assertEqual(cover_quota.split_kept({0, 3, 5, 9}, {3, 5, 7}, 9), (2, 1))


if __name__ == "__main__":
    unittest.main()
