"""ruler_metric's paired comparison: which prompts two runs answered, refused when the prompts
differ, and a run against its own answers (the committed weights, two short prompts)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import ruler_metric

HERE = os.path.dirname(os.path.abspath(__file__))


class AnswersTest(unittest.TestCase):
    def test_answers_of_other_prompts_are_refused_by_field(self):
        cell = {"task": "multi_value", "length": 1024, "prompts": 80, "seed": 31337}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.json")
            with open(path, "w") as f:
                json.dump({**cell, "seed": 7, "correct": [True] * 80}, f)
            with self.assertRaisesRegex(ValueError, "seed is 7, this run's 31337"):
                ruler_metric.read_answers(path, cell)
            with open(path, "w") as f:
                json.dump({**cell, "correct": [True] * 79}, f)
            with self.assertRaisesRegex(ValueError, "holds 79 answers for 80 prompts"):
                ruler_metric.read_answers(path, cell)
            with open(path, "w") as f:
                json.dump({**cell, "correct": [True, False] * 40}, f)
            self.assertEqual(ruler_metric.read_answers(path, cell), [True, False] * 40)


class CommandTest(unittest.TestCase):
    def run_metric(self, *extra):
        args = [sys.executable, os.path.join(HERE, "ruler_metric.py"), "--task", "multi_key",
                "--length", "256", "--prompts", "2", "--seed", "5", *extra]
        return subprocess.run(args, capture_output=True, text=True, timeout=120)

    def test_a_run_against_its_own_answers_fixes_and_misses_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.json")
            first = self.run_metric("--answers", path)
            self.assertEqual(first.returncode, 0, first.stderr)
            with open(path) as f:
                saved = json.load(f)
            self.assertEqual(len(saved["correct"]), 2)
            self.assertIn(f"exact (ours):           {sum(saved['correct'])}/2", first.stdout)
            second = self.run_metric("--against", path)
            self.assertEqual(second.returncode, 0, second.stderr)
            self.assertIn("fixed 0, newly missed 0, exact McNemar p = 1.000", second.stdout)

    def test_against_other_prompts_fails_before_running(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.json")
            with open(path, "w") as f:
                json.dump({"task": "multi_key", "length": 256, "prompts": 3, "seed": 5,
                           "correct": [True] * 3}, f)
            out = self.run_metric("--against", path)
            self.assertEqual(out.returncode, 2)
            self.assertIn("--against", out.stderr)
            self.assertIn("prompts is 3, this run's 2", out.stderr)


if __name__ == "__main__":
    unittest.main()
