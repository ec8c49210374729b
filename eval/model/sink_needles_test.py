"""sink_needles.py on rows whose answers are known, over real prompts of the tasks."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sink_needles  # noqa: E402


def row(policy, prompt, correct, ratio="0.875", page_size="16"):
    return {"task": "multi_value", "length": "1024", "page_size": page_size, "layout": "group",
            "prompt": str(prompt), "policy": policy, "ratio": ratio, "correct": str(correct)}


class SinkNeedlesTest(unittest.TestCase):
    def test_counts_the_prompts_one_policy_answers_with_a_needle_on_page_0(self):
        # Seed 7, 300 prompts of multi-value 1K: the first needle of prompts 0, 1 and 2 starts
        # at token 1, 8 and 8 (page 0), prompt 52's at token 19 (page 1).
        spans = {i: sink_needles.tasks.example_at("multi_value", 1024, 300, i, 7).needle_spans
                 for i in (0, 1, 2, 52)}
        self.assertEqual([min(b for b, _ in spans[i]) for i in (0, 1, 2, 52)], [1, 8, 8, 19])
        rows = [row("a", 0, 1), row("b", 0, 0), row("a", 1, 0), row("b", 1, 1),
                row("a", 2, 1), row("b", 2, 1), row("a", 52, 0), row("b", 52, 1),
                row("a", 3, 1),  # b not measured on prompt 3
                row("a", 0, 0, ratio="0.95"), row("b", 0, 1, ratio="0.95"),  # not asked
                row("a", 1, 1, page_size="32"), row("b", 1, 0, page_size="32")]  # not main
        records = sink_needles.cells(rows, "a", "b", 7, 300, ["multi_value"], [0.875])
        self.assertEqual(records, [{"task": "multi_value", "length": 1024, "ratio": 0.875,
                                    "prompts": 4, "on_first": 3, "a_only": 1, "a_only_first": 1,
                                    "b_only": 2, "b_only_first": 1}])
        self.assertIn("| multi_value 1K, 0.875 | 4 | 3 | 1 | 1 | 2 | 1 |",
                      sink_needles.markdown(records, "a", "b"))
        # C answers prompt 1 (only b answered it, page 0), not prompt 52 (page 1).
        rows += [row("c", 0, 0), row("c", 1, 1), row("c", 2, 0), row("c", 52, 0)]
        records = sink_needles.cells(rows, "a", "b", 7, 300, ["multi_value"], [0.875], "c")
        self.assertEqual((records[0]["c_first"], records[0]["c_elsewhere"]), (1, 0))
        rows[-1] = row("c", 52, 1)
        records = sink_needles.cells(rows, "a", "b", 7, 300, ["multi_value"], [0.875], "c")
        self.assertEqual((records[0]["c_first"], records[0]["c_elsewhere"]), (1, 1))
        self.assertIn("| multi_value 1K, 0.875 | 4 | 3 | 1 | 1 | 2 | 1 | 1 | 1 |",
                      sink_needles.markdown(records, "a", "b", "c"))


if __name__ == "__main__":
    unittest.main()
