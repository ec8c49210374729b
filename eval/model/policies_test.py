"""The policy registry as the Python tools read it: parsed from `entrokv policies --json`
(ENTROKV_CLI names the CLI; ctest sets it), and a document that is not one is refused."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import policies  # noqa: E402

DOCUMENT = ('{"policies": [{"name": "a", "statistic": "last_row", "exact_budget": true}, '
            '{"name": "u", "statistic": "last_row", "exact_budget": false}, '
            '{"name": "h", "statistic": "accumulated", "exact_budget": true}, '
            '{"name": "s", "statistic": "none", "exact_budget": true}]}')


class RegistryTest(unittest.TestCase):
    def test_a_document_reads_in_registry_order(self):
        registry = policies.parse(DOCUMENT)
        self.assertEqual(registry.names, ("a", "u", "h", "s"))
        self.assertEqual(registry.exact_budget_names, ("a", "h", "s"))
        self.assertEqual(registry.statistic("h"), "accumulated")
        self.assertEqual(registry.wanting("accumulated"), ("h",))
        self.assertIn("u", registry)
        self.assertNotIn("x", registry)
        with self.assertRaisesRegex(ValueError, "'x' is not one of a, u, h, s"):
            registry.statistic("x")

    def test_what_is_not_a_registry_is_refused(self):
        for text in ("", "[]", '{"policies": []}', '{"policies": [{"name": "a"}]}',
                     '{"policies": [{"name": "a", "statistic": "middle_row", '
                     '"exact_budget": true}]}'):
            with self.subTest(text=text), self.assertRaises(ValueError):
                policies.parse(text)

    def test_a_missing_cli_says_which(self):
        with self.assertRaisesRegex(RuntimeError, "no-such-entrokv"):
            policies.load("/no-such-entrokv")


@unittest.skipIf("ENTROKV_CLI" not in os.environ, "needs ENTROKV_CLI (run through ctest)")
class CliRegistryTest(unittest.TestCase):
    def test_the_cli_lists_every_policy_with_its_statistic(self):
        registry = policies.load(os.environ["ENTROKV_CLI"])
        self.assertIn("page_entrokv", registry)
        self.assertEqual(registry.statistic("h2o"), "accumulated")
        self.assertEqual(registry.statistic("snapkv"), "window_mean")
        self.assertEqual(registry.statistic("streaming"), "none")
        self.assertNotIn("head_independent", registry.exact_budget_names)
        self.assertEqual(len(registry.exact_budget_names), len(registry.names) - 1)


if __name__ == "__main__":
    unittest.main()
