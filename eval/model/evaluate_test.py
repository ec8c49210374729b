"""The report's arithmetic: Wilson intervals, cells summarised from results.csv rows, and the
tables, including a later pass (--append) that ran fewer prompts than the main one."""
import csv
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evaluate  # noqa: E402


def _rows(policy, ratio, outcomes, kept, prompt_frames=64):
    return [dict(task="single_needle", length=1024, page_size=16, layout="group", prompt=i,
                 depth=0.0, policy=policy, ratio=ratio, correct=c, kept_frames=kept,
                 prompt_frames=prompt_frames, freed_frames=prompt_frames - kept, decide_ms=1.0,
                 decode_ms=1.0)
            for i, c in enumerate(outcomes)]


class WilsonTest(unittest.TestCase):
    def test_known_intervals(self):
        low, high = evaluate.wilson(5, 10)
        self.assertAlmostEqual(low, 0.2366, places=4)
        self.assertAlmostEqual(high, 0.7634, places=4)
        low, high = evaluate.wilson(0, 10)
        self.assertEqual(low, 0.0)
        self.assertAlmostEqual(high, 0.2775, places=4)
        low, high = evaluate.wilson(10, 10)
        self.assertAlmostEqual(low, 0.7225, places=4)
        self.assertAlmostEqual(high, 1.0, places=9)


class SummaryTest(unittest.TestCase):
    def summarize(self, rows):
        with tempfile.TemporaryDirectory() as out:
            with open(os.path.join(out, "results.csv"), "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=evaluate.FIELDS)
                writer.writeheader()
                writer.writerows(rows)
            summary = evaluate.summarize(out)
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

    def test_a_pass_with_fewer_prompts_is_labelled_with_its_count(self):
        rows = (_rows("none", 0.0, [1] * 6, 64) + _rows("mean", 0.75, [1] * 6, 16) +
                _rows("mean+window", 0.75, [1, 0], 16))
        _, text = self.summarize(rows)
        self.assertIn("(6 prompts; no eviction:", text)
        self.assertIn("| mean | 100% [61, 100] |", text)
        self.assertIn("| mean+window (2 prompts) | 50% [9, 91] |", text)


if __name__ == "__main__":
    unittest.main()
