"""torch_model's forward against numpy_model's, on the CPU (the GPU run is the CUDA worker's
check, bench/gpu/worker_checks.sh): logits to float32 tolerance, the same statistics, and the
same greedy answers with the committed weights. Skipped where PyTorch is not installed."""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import tasks  # noqa: E402
from model_test import random_model  # noqa: E402

try:
    import torch  # noqa: E402
    import torch_model  # noqa: E402
except ImportError:
    torch = None

WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights.npz")


@unittest.skipIf(torch is None, "needs PyTorch")
class TorchModelTest(unittest.TestCase):
    def test_logits_and_statistics_match_the_numpy_model(self):
        model = random_model()
        twin = torch_model.TorchModel(model, "cpu")
        prompt = tasks.make_example("multi_key", 300, 3).prompt  # two query blocks
        np.testing.assert_allclose(twin.forward(prompt), model.forward(prompt), rtol=1e-4,
                                   atol=1e-4)
        seen_numpy, seen_torch = {}, {}
        n = len(prompt)
        model.step(prompt, np.arange(n), numpy_model.DenseKV(model.config), [1, 40, n],
                   lambda layer, stat: seen_numpy.__setitem__(layer, stat))
        twin.step(prompt, np.arange(n), torch_model.TorchDenseKV(model.config, "cpu"), [1, 40, n],
                  lambda layer, stat: seen_torch.__setitem__(layer, stat))
        self.assertEqual(sorted(seen_torch), list(range(model.config.layers)))
        for layer, windows in seen_numpy.items():
            for w, groups in windows.items():
                for g, rows in enumerate(groups):
                    np.testing.assert_allclose(seen_torch[layer][w][g].numpy(), rows, rtol=1e-4,
                                               atol=1e-6)

    def test_a_changed_weight_is_noticed(self):
        # The comparison above can fail: one weight changed moves the logits.
        model = random_model()
        twin = torch_model.TorchModel(model, "cpu")
        twin.w["layers.1.wv.weight"][0, 0] += 1.0
        prompt = tasks.make_example("multi_key", 100, 3).prompt
        self.assertFalse(np.allclose(twin.forward(prompt), model.forward(prompt), rtol=1e-4,
                                     atol=1e-4))

    @unittest.skipUnless(os.path.exists(WEIGHTS), "no committed weights")
    def test_greedy_answers_are_the_same(self):
        model = numpy_model.Model.load(WEIGHTS)
        twin = torch_model.TorchModel(model, "cpu")
        for task in ("single_needle", "variable_tracking"):
            for example in tasks.examples(task, 512, 2, seed=5):
                budget = tasks.answer_budget(example)
                self.assertEqual(twin.generate(example.prompt, budget, tasks.EOS),
                                 model.generate(example.prompt, budget, tasks.EOS))


if __name__ == "__main__":
    unittest.main()
