"""Wilson intervals, discordant counts and exact McNemar p values against values worked by hand."""
import unittest

import significance


class WilsonTest(unittest.TestCase):
    def test_known_intervals(self):
        low, high = significance.wilson(5, 10)
        self.assertAlmostEqual(low, 0.2366, places=4)
        self.assertAlmostEqual(high, 0.7634, places=4)
        low, high = significance.wilson(0, 10)
        self.assertEqual(low, 0.0)
        self.assertAlmostEqual(high, 0.2775, places=4)
        low, high = significance.wilson(10, 10)
        self.assertAlmostEqual(low, 0.7225, places=4)
        self.assertAlmostEqual(high, 1.0, places=9)


class DiscordantTest(unittest.TestCase):
    def test_counts_the_prompts_only_one_side_answered(self):
        before = [True, False, False, True, True]
        after = [True, True, False, False, False]
        self.assertEqual(significance.discordant(after, before), (1, 2))
        self.assertEqual(significance.discordant(before, after), (2, 1))
        self.assertEqual(significance.discordant(before, before), (0, 0))
        self.assertEqual(significance.discordant([1, 0, 1], [0, 0, 1]), (1, 0))


class McNemarTest(unittest.TestCase):
    def test_known_p_values(self):
        self.assertAlmostEqual(significance.mcnemar(10, 0), 2 / 1024)
        self.assertAlmostEqual(significance.mcnemar(15, 1), 2 * 17 / 65536)
        self.assertAlmostEqual(significance.mcnemar(1, 3), 2 * 5 / 16)
        self.assertEqual(significance.mcnemar(3, 3), 1.0)  # 2 x (tail of 42/64) is capped at 1
        self.assertEqual(significance.mcnemar(0, 0), 1.0)
        self.assertEqual(significance.mcnemar(4, 9), significance.mcnemar(9, 4))


if __name__ == "__main__":
    unittest.main()
