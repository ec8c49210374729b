"""The committed weights: the file the record was made from, and the accuracy it records."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import weights_check  # noqa: E402


class CommittedWeightsTest(unittest.TestCase):
    def setUp(self):
        with open(weights_check.RECORD) as f:
            self.record = json.load(f)

    def test_the_record_describes_these_weights(self):
        self.assertEqual(weights_check.sha256(weights_check.WEIGHTS), self.record["weights_sha256"])

    def test_no_eviction_accuracy_is_as_recorded(self):
        # Greedy answers of a deterministic forward; another BLAS may reorder float sums, so a
        # near-tie could flip one answer: allow one prompt per cell, never more.
        model = numpy_model.Model.load(weights_check.WEIGHTS)
        cells = [(c["task"], c["length"], c["prompts"]) for c in self.record["cells"]]
        for measured, recorded in zip(weights_check.measure(model, cells), self.record["cells"]):
            with self.subTest(task=recorded["task"], length=recorded["length"]):
                self.assertLessEqual(abs(measured["correct"] - recorded["correct"]), 1)


if __name__ == "__main__":
    unittest.main()
