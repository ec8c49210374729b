"""The report's arithmetic: cells summarised from results.csv rows, and the
tables, including a later pass (--append) that ran fewer prompts than the main one; and a
stopped run resumed (--resume) against a real entrokvd (ENTROKVD names it, ENTROKV_CLI the CLI
whose registry names the policies; ctest sets both)."""
import contextlib
import csv
import dataclasses
import gzip
import io
import json
import os
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evaluate  # noqa: E402
import numpy_model  # noqa: E402
import pool_worker  # noqa: E402
from model_test import random_model  # noqa: E402


# The tables' policy order in these tests (evaluate.main passes the registry's).
ORDER = ("page_entrokv", "mean", "head_independent", "snapkv")


def _rows(policy, ratio, outcomes, kept, prompt_frames=64, moved=0):
    return [dict(task="single_needle", length=1024, page_size=16, layout="group", prompt=i,
                 depth=0.0, policy=policy, ratio=ratio, correct=c, kept_frames=kept,
                 prompt_frames=prompt_frames, freed_frames=prompt_frames - kept,
                 moved_frames=moved, decide_ms=1.0, decode_ms=1.0)
            for i, c in enumerate(outcomes)]


def _write_results(out, rows, compressed=False):
    path = os.path.join(out, "results.csv" + (".gz" if compressed else ""))
    with (gzip.open(path, "wt", newline="") if compressed else open(path, "w", newline="")) as f:
        writer = csv.DictWriter(f, fieldnames=evaluate.FIELDS)
        writer.writeheader()
        writer.writerows(rows)


class SummaryTest(unittest.TestCase):
    def summarize(self, rows):
        with tempfile.TemporaryDirectory() as out:
            _write_results(out, rows)
            summary = evaluate.summarize(out, ORDER)
            with open(os.path.join(out, "tables.md")) as f:
                return summary, f.read()

    def test_cells_count_accuracy_and_frames(self):
        rows = (_rows("none", 0.0, [1, 1, 1, 0], 64) +
                _rows("mean", 0.75, [1, 0, 0, 0], 16) +
                _rows("head_independent", 0.75, [1, 1, 0, 0], 40))
        summary, text = self.summarize(rows)
        cells = {(s["policy"], s["ratio"]): s for s in summary}
        self.assertEqual(cells[("none", 0.0)]["correct"], 3)
        self.assertEqual(cells[("mean", 0.75)]["accuracy"], 0.25)
        self.assertEqual(cells[("mean", 0.75)]["kept_share"], 0.25)
        self.assertEqual(cells[("head_independent", 0.75)]["kept_share"], 0.625)
        self.assertIn("(4 prompts; no eviction: 75% [30, 95])", text)
        self.assertIn("| mean | 25% [5, 70] |", text)
        self.assertIn("| head_independent | 62.5% |", text)
        self.assertNotIn("beyond a group's quota", text)

    def test_frames_moved_between_groups_are_a_share_of_the_frames_kept(self):
        rows = (_rows("none", 0.0, [1, 1], 64) + _rows("mean", 0.75, [1, 0], 16) +
                _rows("mean+gf25", 0.75, [1, 1], 16, moved=4))
        summary, text = self.summarize(rows)
        cells = {(s["policy"], s["ratio"]): s for s in summary}
        self.assertEqual(cells[("mean+gf25", 0.75)]["moved_share"], 0.25)
        self.assertEqual(cells[("mean", 0.75)]["moved_share"], 0.0)
        self.assertIn("| mean+gf25 | 25.0% |", text)
        self.assertNotIn("| mean | 0.0% |", text)

    def test_resuming_a_results_file_of_other_columns_stops_with_a_message(self):
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "results.csv")
            with open(path, "w") as f:
                f.write("task,length,correct\nsingle_needle,1024,1\n")
            with self.assertRaisesRegex(SystemExit, "new --out"):
                evaluate.measured(path)

    def test_paired_comparisons_count_discordant_prompts(self):
        rows = (_rows("none", 0.0, [1] * 6, 64) +
                _rows("page_entrokv", 0.75, [1, 1, 1, 1, 0, 1], 16) +
                _rows("mean", 0.75, [0, 0, 0, 1, 1, 1], 16) +
                _rows("snapkv", 0.75, [1, 1], 16))  # a pass on the first two prompts only
        pairs = {p["policy"]: p for p in evaluate.comparisons(rows)}
        self.assertEqual(set(pairs), {"mean", "snapkv"})
        mean = pairs["mean"]
        self.assertEqual((mean["prompts"], mean["better"], mean["worse"]), (6, 3, 1))
        self.assertEqual((mean["reference_correct"], mean["policy_correct"]), (5, 3))
        self.assertAlmostEqual(mean["p"], 0.625)
        snapkv = pairs["snapkv"]
        self.assertEqual((snapkv["prompts"], snapkv["better"], snapkv["worse"]), (2, 0, 0))
        with tempfile.TemporaryDirectory() as out:
            _write_results(out, rows)
            evaluate.summarize(out, ORDER)
            with open(os.path.join(out, "paired.md")) as f:
                text = f.read()
        self.assertIn("| mean | +3 / -1 (p = 0.625) |", text)
        self.assertIn("| snapkv | +0 / -0 (p = 1.000) |", text)

    def test_both_plots_are_drawn(self):
        rows = (_rows("none", 0.0, [1, 1, 1, 0], 64) + _rows("mean", 0.75, [1, 0, 0, 0], 16) +
                _rows("head_independent", 0.75, [1, 1, 0, 0], 40))
        with tempfile.TemporaryDirectory() as out:
            _write_results(out, rows)
            evaluate.summarize(out, ORDER)
            images = []
            for name in ("accuracy.png", "accuracy_memory.png"):
                with open(os.path.join(out, name), "rb") as f:
                    images.append(f.read())
            self.assertTrue(all(image.startswith(b"\x89PNG") for image in images))
            self.assertNotEqual(images[0], images[1])  # different x axes

    def test_a_compressed_report_summarizes_as_the_plain_one(self):
        rows = _rows("none", 0.0, [1, 1, 0], 64) + _rows("mean", 0.75, [1, 0, 0], 16)
        summary, text = self.summarize(rows)
        with tempfile.TemporaryDirectory() as out:
            _write_results(out, rows, compressed=True)
            self.assertEqual(evaluate.summarize(out, ORDER), summary)
            with open(os.path.join(out, "tables.md")) as f:
                self.assertEqual(f.read(), text)
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
                evaluate.main(["--weights", "w.npz", "--out", out, "--resume"])
            self.assertIn("results.csv.gz holds this folder's rows", err.getvalue())
            self.assertFalse(os.path.exists(os.path.join(out, "results.csv")))

    def test_policy_suffixes_name_the_statistic_and_the_neighbourhood(self):
        self.assertEqual(evaluate.policy_of("mean+keydiff", 0.75).statistic, "keys_keydiff")
        self.assertEqual(evaluate.policy_of("mean+knorm", 0.75).statistic, "keys_norm")
        self.assertEqual(evaluate.policy_of("mean+expattn", 0.75).statistic, "keys_expected")
        self.assertEqual(evaluate.policy_of("mean+expattnw", 0.75).statistic,
                         "keys_expected_window")
        self.assertEqual(evaluate.policy_of("mean+expattnm", 0.75).statistic,
                         "keys_expected_mean")
        self.assertEqual(evaluate.policy_of("mean+winkeys", 0.75).statistic, "window_keydiff")
        self.assertEqual(evaluate.policy_of("mean+winexp", 0.75).statistic, "window_expected")
        self.assertEqual(evaluate.policy_of("mean+winexp25", 0.75).statistic,
                         "window_expected_k25")
        self.assertEqual(evaluate.policy_of("mean+expattnr8", 0.75).statistic, "keys_expected_r8")
        pyramid = evaluate.policy_of("snapkv+pyramid", 0.75)
        self.assertEqual(pyramid.budget(), {"fraction": 0.25, "allocator": "pyramid"})
        self.assertEqual(evaluate.policy_of("snapkv", 0.75).budget(), {"fraction": 0.25})
        with self.assertRaisesRegex(ValueError, r"\+pyramid"):
            evaluate.policy_of("snapkv+pyramid+pyramid", 0.75)
        self.assertEqual(evaluate.policy_of("mean+mass", 0.75).budget(),
                         {"fraction": 0.25, "allocator": "mass"})
        self.assertEqual(evaluate.policy_of("mean+mass25", 0.75).budget(),
                         {"fraction": 0.25, "allocator": "mass", "layer_floor": 0.25})
        for bad in ("mean+mass+pyramid", "mean+mass101", "mean+massive"):
            with self.assertRaisesRegex(ValueError, r"\+mass"):
                evaluate.policy_of(bad, 0.75)
        both = evaluate.policy_of("page_entrokv+acc+nb7max", 0.5)
        self.assertEqual((both.statistic, dict(both.params)["neighbourhood_kernel"]),
                         ("accumulated", 7))
        with self.assertRaisesRegex(ValueError, r"\+keydiff"):
            evaluate.policy_of("mean+keydiff+window", 0.75)
        moved = evaluate.policy_of("mean+keydiff+nb7max+gf25", 0.75)
        self.assertEqual(dict(moved.params)["group_floor"], 0.25)
        self.assertEqual(dict(moved.params)["neighbourhood_kernel"], 7)
        for bad in ("mean+gf25+gf50", "mean+gf101"):
            with self.assertRaisesRegex(ValueError, r"\+gf"):
                evaluate.policy_of(bad, 0.75)
        sinks = evaluate.policy_of("mean+winexpcoverfwd7+pyramid+sinks", 0.75)
        self.assertEqual(dict(sinks.params), {"protect_sink_pages": True})
        with self.assertRaisesRegex(ValueError, r"\+sinks"):
            evaluate.policy_of("mean+sinks+sinks", 0.75)
        recent = evaluate.policy_of("mean+winexpcoverfwdsink50+pyramid+recent2", 0.75)
        self.assertEqual(dict(recent.params), {"protect_recent_pages": 2})
        for bad in ("mean+recent2+recent3", "mean+recent", "mean+recentx"):
            with self.assertRaisesRegex(ValueError, r"\+recent<k>"):
                evaluate.policy_of(bad, 0.75)

    def test_policies_follow_the_given_order_then_the_variants(self):
        part = [{"policy": p} for p in ("mean+window", "mean", "none", "page_entrokv", "zeta")]
        self.assertEqual(evaluate._policies(part, ("page_entrokv", "mean")),
                         ["page_entrokv", "mean", "mean+window", "zeta"])
        self.assertEqual(evaluate._policies(part, ("mean", "page_entrokv")),
                         ["mean", "page_entrokv", "mean+window", "zeta"])

    def test_a_prompt_measured_twice_is_refused(self):
        rows = _rows("none", 0.0, [1, 1], 64) + _rows("mean", 0.75, [1, 0], 16)
        with self.assertRaisesRegex(SystemExit, r"line 6 measures again .* of line 4"):
            self.summarize(rows + rows[2:3])

    def test_a_pass_with_fewer_prompts_is_labelled_with_its_count(self):
        rows = (_rows("none", 0.0, [1] * 6, 64) + _rows("mean", 0.75, [1] * 6, 16) +
                _rows("mean+window", 0.75, [1, 0], 16))
        _, text = self.summarize(rows)
        self.assertIn("(6 prompts; no eviction:", text)
        self.assertIn("| mean | 100% [61, 100] |", text)
        self.assertIn("| mean+window (2 prompts) | 50% [9, 91] |", text)


@unittest.skipIf("ENTROKVD" not in os.environ or "ENTROKV_CLI" not in os.environ,
                 "needs ENTROKVD and ENTROKV_CLI (run through ctest)")
class ResumeTest(unittest.TestCase):
    """A run stopped mid-write and resumed holds exactly the rows of a run never stopped."""

    TIMES = ("decide_ms", "decode_ms")

    def setUp(self):
        """A folder, a random model's weights in it and a daemon, for each test (the daemon
        last: tearDown stops it, and runs only when setUp succeeded)."""
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        self.tmp = folder.name
        self.weights = os.path.join(self.tmp, "w.npz")
        np.savez(self.weights, config_json=np.array(json.dumps(
            dataclasses.asdict(numpy_model.Config()))), **random_model().w)
        self.daemon = pool_worker.LocalDaemon(os.environ["ENTROKVD"])

    def tearDown(self):
        self.assertEqual(self.daemon.stop(), 0)

    def evaluate(self, out, *extra):
        argv = ["--weights", self.weights, "--server", self.daemon.address,
                "--entrokv", os.environ["ENTROKV_CLI"], "--out", out,
                "--tasks", "single_needle,multi_key", "--lengths", "200", "--prompts", "3",
                "--policies", "mean,snapkv", "--ratios", "0.5", "--also", "layer:0.75",
                "--processes", "1", *extra]
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            self.assertEqual(evaluate.main(argv), 0)
        return printed.getvalue()

    def rows(self, out):
        with open(os.path.join(out, "results.csv"), newline="") as f:
            return sorted(tuple(v for k, v in r.items() if k not in self.TIMES)
                          for r in csv.DictReader(f))

    def test_resume_runs_only_what_is_missing(self):
        whole, stopped = os.path.join(self.tmp, "whole"), os.path.join(self.tmp, "stopped")
        self.evaluate(whole)
        # 2 tasks x 3 prompts x (none, mean, snapkv), then the layer pass's 6 x 3.
        self.assertEqual(len(self.rows(whole)), 36)
        os.makedirs(stopped)
        with open(os.path.join(whole, "results.csv"), "rb") as f:
            lines = f.read().split(b"\n")
        with open(os.path.join(stopped, "results.csv"), "wb") as f:
            # The header, 7 rows (prompt 2 of the first task half written), a cut line.
            f.write(b"\n".join(lines[:8]) + b"\n" + lines[8][:10])
        printed = self.evaluate(stopped, "--resume")
        self.assertEqual(self.rows(stopped), self.rows(whole))
        # The main pass had 6 prompts: 2 whole, 1 lacking two settings; the layer pass none.
        self.assertIn("group b16: 4/4 prompts", printed)
        self.assertIn("layer b16: 6/6 prompts", printed)
        printed = self.evaluate(stopped, "--resume")  # nothing left: nothing run
        self.assertEqual(self.rows(stopped), self.rows(whole))
        self.assertEqual(printed.count("every prompt already measured"), 2)

    def test_a_later_pass_measures_only_what_is_missing(self):
        out = os.path.join(self.tmp, "out")
        self.evaluate(out, "--also", "")
        before = self.rows(out)
        # The same settings again, then one new ratio beside them.
        printed = self.evaluate(out, "--also", "", "--append")
        self.assertIn("every prompt already measured", printed)
        self.assertEqual(self.rows(out), before)
        self.evaluate(out, "--also", "", "--append", "--ratios", "0.5,0.75")
        added = [r for r in self.rows(out) if r not in before]
        self.assertEqual(len(self.rows(out)), len(before) + len(added))
        # 2 tasks x 3 prompts x (mean, snapkv) at 0.75, and nothing at 0.5.
        self.assertEqual(len(added), 12)
        self.assertEqual({r[evaluate.FIELDS.index("ratio")] for r in added}, {"0.75"})

    def test_a_later_pass_on_every_kth_prompt_runs_the_main_pass_prompts(self):
        out = os.path.join(self.tmp, "out")
        self.evaluate(out, "--also", "")
        self.evaluate(out, "--append", "--resume", "--every", "2")
        with open(os.path.join(out, "results.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        main = {(r["task"], r["prompt"]): r["depth"] for r in rows if r["layout"] == "group"}
        later = {(r["task"], r["prompt"]): r["depth"] for r in rows if r["layout"] == "layer"}
        # Prompts 0 and 2 of each task's 3, the same prompts (depths) as the main pass.
        self.assertEqual(sorted(later), [(t, p) for t in ("multi_key", "single_needle")
                                         for p in ("0", "2")])
        self.assertEqual(later, {key: main[key] for key in later})
        self.assertEqual(len(rows), 2 * 3 * 3 + 2 * 2 * 3)


if __name__ == "__main__":
    unittest.main()
