"""agreement.py on rows whose answers and frames are known."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agreement  # noqa: E402


def row(policy, prompt, correct, frames, ratio="0.5", page_size="16"):
    return {"task": "multi_key", "length": "1024", "page_size": page_size, "layout": "group",
            "prompt": str(prompt), "policy": policy, "ratio": ratio, "correct": str(correct),
            "kept_frames": str(frames)}


class AgreementTest(unittest.TestCase):
    def test_counts_the_pairs_where_two_policies_answer_or_keep_differently(self):
        rows = [row("none", 0, 1, 64, "0.0"),
                row("a", 0, 1, 32), row("b", 0, 0, 32), row("c", 0, 1, 32),
                row("a", 1, 0, 32), row("b", 1, 1, 30), row("c", 1, 0, 32),
                row("a", 2, 1, 32), row("b", 2, 0, 32),  # c not measured on prompt 2
                row("a", 0, 0, 8, page_size="32")]  # not the main pass
        records = {(r["a"], r["b"]): r for r in agreement.agreement(rows)}
        self.assertEqual(list(records), [("a", "b"), ("a", "c"), ("b", "c")])
        self.assertEqual(records[("a", "b")],
                         {"a": "a", "b": "b", "pairs": 3, "a_only": 2, "b_only": 1,
                          "frames_differ": 1})
        self.assertEqual(records[("a", "c")]["pairs"], 2)
        self.assertEqual(records[("a", "c")]["a_only"] + records[("a", "c")]["b_only"], 0)
        self.assertEqual(records[("b", "c")]["frames_differ"], 1)

    def test_writes_its_table_into_the_report(self):
        with tempfile.TemporaryDirectory() as out:
            with open(os.path.join(out, "results.csv"), "w") as f:
                f.write("task,length,page_size,layout,prompt,policy,ratio,correct,kept_frames\n"
                        "multi_key,1024,16,group,0,a,0.5,1,32\n"
                        "multi_key,1024,16,group,0,b,0.5,0,32\n")
            self.assertEqual(agreement.main(["--out", out]), 0)
            with open(os.path.join(out, "agreement.md")) as f:
                self.assertIn("| a | b | 1 | 1 | 1 | 0 | 0 |", f.read())

    def test_a_folder_without_results_is_a_usage_error(self):
        with tempfile.TemporaryDirectory() as out:
            with self.assertRaises(SystemExit) as stop:
                agreement.main(["--out", out])
            self.assertEqual(stop.exception.code, 2)


if __name__ == "__main__":
    unittest.main()
