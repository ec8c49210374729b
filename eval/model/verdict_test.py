"""The goal check (verdict.py) on rows whose answers are known: which cells the reference is
significantly behind in, which policies keep more frames and so are not held to it, the cells
ahead of the anchor, and whether the reference kept the anchor's frames."""
import csv
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evaluate  # noqa: E402
import verdict  # noqa: E402


def _rows(policy, ratio, outcomes, kept, task="single_needle", length=1024):
    return [dict(task=task, length=length, page_size=16, layout="group", prompt=i, depth=0.0,
                 policy=policy, ratio=ratio, correct=c,
                 kept_frames=kept[i] if isinstance(kept, list) else kept, prompt_frames=64,
                 freed_frames=0, moved_frames=0, decide_ms=1.0, decode_ms=1.0)
            for i, c in enumerate(outcomes)]


ALL, NONE = [1] * 12, [0] * 12


def _check(rows):
    return verdict.check(rows, evaluate.comparisons(rows, "dflt"), "dflt")


class VerdictTest(unittest.TestCase):
    def test_a_significant_loss_to_a_policy_with_as_few_frames_is_named(self):
        rows = (_rows("dflt", 0.75, NONE, 16) + _rows("snapkv", 0.75, NONE, 16) +
                _rows("cheap", 0.75, ALL, 12) +  # fewer frames, ahead in 12 of 12: p < 0.001
                _rows("dflt", 0.5, ALL, 32) + _rows("snapkv", 0.5, ALL, 32) +
                _rows("cheap", 0.5, ALL, 24))
        result = _check(rows)
        self.assertEqual([(c, p["policy"]) for c, p in result["behind"]],
                         [(("single_needle", 1024, 0.75), "cheap")])
        self.assertEqual(result["ahead"], [])
        text = verdict.markdown(result)
        self.assertIn("in 1 of 2 cells (not met). Corrected for the 4 comparisons it is held to "
                      "(Holm): in 1 of 2 cells.", text)
        self.assertIn("| single_needle 1K 0.75 | cheap | +0 / -12 (p < 0.001) |", text)

    def test_holm_holds_the_smallest_p_to_alpha_over_the_count(self):
        self.assertEqual(verdict.holm_threshold([0.04, 0.01, 0.3]), 0.01)  # 0.01 < 0.05 / 3
        self.assertEqual(verdict.holm_threshold([0.02, 0.02, 0.3]), -1.0)  # 0.02 >= 0.05 / 3
        self.assertEqual(verdict.holm_threshold([0.001, 0.02, 0.024]), 0.024)  # 0.024 < 0.05
        self.assertEqual(verdict.holm_threshold([]), -1.0)

    def test_a_policy_keeping_more_frames_is_not_held_to_the_reference(self):
        rows = (_rows("dflt", 0.75, NONE, 16) + _rows("snapkv", 0.75, NONE, 16) +
                _rows("union", 0.75, ALL, 20))
        result = _check(rows)
        self.assertEqual(result["behind"], [])
        self.assertEqual(result["larger"], ["union"])
        self.assertIn("in 0 of 1 cells (met)", verdict.markdown(result))

    def test_cells_ahead_of_the_anchor_count_towards_a_quarter(self):
        rows = []
        four = ("single_needle", "multi_key", "multi_value", "variable_tracking")
        for n, task in enumerate(four):
            rows += _rows("dflt", 0.75, ALL, 16, task=task)
            # significantly behind in the first cell only; level in the others
            rows += _rows("snapkv", 0.75, NONE if n == 0 else ALL, 16, task=task)
        result = _check(rows)
        self.assertEqual(result["ahead"], [("single_needle", 1024, 0.75)])
        self.assertIn("in 1 of 4 cells (a quarter is 1: met)", verdict.markdown(result))
        rows = [r for r in rows if not (r["task"] == "single_needle" and r["policy"] == "snapkv")]
        rows += _rows("snapkv", 0.75, [0] * 5 + [1] * 7, 16)  # 5 discordant prompts: p = 0.0625
        self.assertEqual(_check(rows)["ahead"], [])

    def test_frames_other_than_the_anchor_s_are_counted_prompt_by_prompt(self):
        kept = [16] * 12
        kept[3] = 19
        rows = _rows("dflt", 0.75, ALL, kept) + _rows("snapkv", 0.75, ALL, 16)
        result = _check(rows)
        self.assertEqual((result["frames_compared"], result["frames_differ"],
                          result["frames_max_difference"]), (12, 1, 3))
        self.assertIn("on 11 of 12 prompts (at most 3 apart)", verdict.markdown(result))

    def test_summarize_writes_the_verdict_and_its_picture(self):
        rows = (_rows("dflt", 0.75, ALL, 16) + _rows("snapkv", 0.75, NONE, 16) +
                _rows("mean", 0.75, ALL, 16))
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "results.csv")
            with open(path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=evaluate.FIELDS)
                writer.writeheader()
                writer.writerows(rows)
            evaluate.summarize(out, ("snapkv", "mean"), reference="dflt")
            with open(os.path.join(out, "verdict.md")) as f:
                self.assertIn("The goal, checked for dflt", f.read())
            with open(os.path.join(out, "verdict.png"), "rb") as f:
                self.assertTrue(f.read().startswith(b"\x89PNG"))
            with open(os.path.join(out, "standings.md")) as f:
                standings = f.read()
            # snapkv is behind both others (12 of 12, p < 0.001); the registry's order first.
            self.assertLess(standings.index("| snapkv |"), standings.index("| dflt |"))
            self.assertIn("| snapkv | 1 | 1 | 1 | - | single_needle 1K 0.75 (Holm) |", standings)
            self.assertIn("| dflt | 1 | 0 | 0 | 1 | - |", standings)

    def test_standings_hold_every_policy_to_the_goal_in_turn(self):
        rows = (_rows("dflt", 0.75, NONE, 16) + _rows("snapkv", 0.75, NONE, 16) +
                _rows("cheap", 0.75, ALL, 12) +
                _rows("dflt", 0.5, ALL, 32) + _rows("snapkv", 0.5, NONE, 32) +
                _rows("cheap", 0.5, ALL, 40))  # more frames: nobody is held to it there
        text = verdict.standings(rows, lambda p: evaluate.comparisons(rows, p),
                                 ["snapkv", "dflt", "cheap", "absent"])
        self.assertIn("| snapkv | 2 | 2 | 2 | - | single_needle 1K 0.5 (Holm), "
                      "single_needle 1K 0.75 (Holm) |", text)
        self.assertIn("| dflt | 2 | 1 | 1 | 1 | single_needle 1K 0.75 (Holm) |", text)
        self.assertIn("| cheap | 2 | 0 | 0 | 2 | - |", text)
        self.assertNotIn("absent", text)


if __name__ == "__main__":
    unittest.main()
