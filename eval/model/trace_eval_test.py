"""`entrokv eval --trace` on the committed real-model trace (eval/traces/): the simulator's
report runs on the small GQA model's real attention, and its structural claims hold there.

Needs the CLI: ENTROKV_CLI is the `entrokv` binary, ENTROKV_TRACE the trace directory (ctest
sets both).
"""
import csv
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import policies  # noqa: E402


class TraceEvalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cli = os.environ.get("ENTROKV_CLI")
        cls.trace = os.environ.get("ENTROKV_TRACE")
        if not cls.cli or not cls.trace:
            raise unittest.SkipTest("ENTROKV_CLI and ENTROKV_TRACE are set by ctest")
        cls.registry = policies.load(cls.cli)
        with open(os.path.join(cls.trace, "trace.json")) as f:
            cls.meta = json.load(f)
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = os.path.join(cls.tmp.name, "eval")
        done = subprocess.run([cls.cli, "eval", "--trace", cls.trace, "--out", cls.out,
                               "--no-plots", "--no-progress", "--page-sizes", "1,8,16"],
                              capture_output=True, text=True, timeout=240)
        cls.returncode, cls.stderr = done.returncode, done.stderr

        def rows(name):
            with open(os.path.join(cls.out, name), newline="") as f:
                return list(csv.DictReader(f))

        if cls.returncode == 0:
            cls.results = rows("results.csv")
            cls.heads = rows("heads.csv")
            cls.uor_groups = rows("uor_groups.csv")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        self.assertEqual(self.returncode, 0, self.stderr)

    def test_trace_is_a_real_capture(self):
        self.assertEqual(self.meta["format"], "entrokv-trace")
        self.assertEqual(self.meta["model"]["name"], "entrokv-gqa-small")
        self.assertIn("weights sha256=", self.meta["source"])
        stats = np.load(os.path.join(self.trace, "stats.npy"))
        model = self.meta["model"]
        self.assertEqual(stats.shape, (model["layers"], model["query_heads"],
                                       self.meta["tokens"]))
        # Probability rows over the causal prefix, and not a flat placeholder.
        np.testing.assert_allclose(stats.sum(axis=-1), 1.0, atol=1e-4)
        self.assertGreater(stats.max(), 10.0 / self.meta["tokens"])
        self.assertTrue(os.path.exists(os.path.join(self.trace, "accumulated.npy")))

    def test_every_policy_budget_and_page_size_is_reported(self):
        self.assertEqual({r["model"] for r in self.results}, {"entrokv-gqa-small"})
        self.assertEqual({int(r["tokens"]) for r in self.results}, {self.meta["tokens"]})
        self.assertEqual({r["policy"] for r in self.results}, set(self.registry.names))
        self.assertEqual(len(self.results), len(self.registry.names) * 5 * 3)
        # The trace has LAST_ROW and accumulated.npy: a policy that wants ACCUMULATED gets it,
        # one that reads nothing none, every other one the trace's LAST_ROW.
        given = {"accumulated": "accumulated", "none": "none"}
        for r in self.results:
            self.assertEqual(r["statistic"],
                             given.get(self.registry.statistic(r["policy"]), "last_row"),
                             r["policy"])
        self.assertIn("accumulated", {r["statistic"] for r in self.results})

    def test_pooled_policies_keep_exactly_the_plan(self):
        for r in self.results:
            if r["policy"] not in self.registry.exact_budget_names:
                continue
            where = f"{r['policy']} budget {r['budget']} B {r['page_size']}"
            self.assertEqual(r["exact_groups"], r["groups"], where)
            self.assertEqual(r["kept_frames"], r["planned_frames"], where)
            self.assertEqual(float(r["uor_mean"]), 1.0, where)
            self.assertEqual(float(r["uor_max"]), 1.0, where)

    def test_head_independent_union_is_inside_its_certificates(self):
        r_group = self.meta["model"]["query_heads"] // self.meta["model"]["kv_groups"]
        above = 0.0
        for r in self.results:
            if r["policy"] != "head_independent":
                continue
            where = f"budget {r['budget']} B {r['page_size']}"
            self.assertGreaterEqual(float(r["uor_min"]), 1.0, where)
            self.assertLessEqual(float(r["uor_max"]), r_group, where)
            self.assertGreaterEqual(int(r["kept_frames"]), int(r["planned_frames"]), where)
            self.assertEqual(int(r["bound_violations"]), 0, where)
            above = max(above, float(r["uor_above_one"]))
        # Real heads of one group do not all pick the same tokens.
        self.assertGreater(above, 0.0)
        for s in self.uor_groups:
            self.assertGreaterEqual(float(s["uor"]), float(s["bonferroni"]) - 1e-9)
            self.assertGreaterEqual(float(s["uor"]), float(s["sandwich_lower"]) - 1e-9)
            self.assertLessEqual(float(s["uor"]), float(s["sandwich_upper"]) + 1e-9)

    def test_largest_weight_falls_with_temperature(self):
        for variant in ("raw", "isolated"):
            sweep = [(float(h["x"]), float(h["value"])) for h in self.heads
                     if h["analysis"] == "tau_sweep" and h["variant"] == variant]
            self.assertGreater(len(sweep), 3)
            values = [v for _, v in sorted(sweep)]
            for a, b in zip(values, values[1:]):
                self.assertGreaterEqual(a, b - 1e-12, variant)
            self.assertGreater(values[-1], 1.0 / 4 - 1e-9)  # never below uniform 1/r


if __name__ == "__main__":
    unittest.main()
