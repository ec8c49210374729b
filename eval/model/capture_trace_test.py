"""capture_trace: deterministic captures, the statistic (docs/architecture.md §3.1), the trace format."""
import filecmp
import json
import os
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capture_trace  # noqa: E402
import numpy_model  # noqa: E402
import tasks  # noqa: E402
from model_test import random_model  # noqa: E402


def layer0_attention(model, tokens):
    """The full causal attention matrix of layer 0, [H_Q, T, T], computed from the weights
    directly (an independent statement of the forward, not numpy_model's loop)."""
    c, w = model.config, model.w
    x = w["embed.weight"][tokens]
    h = numpy_model.rms_norm(x, w["layers.0.attn_norm.weight"], c.norm_eps).astype(np.float64)
    n = len(tokens)
    q = (h @ w["layers.0.wq.weight"].T).reshape(n, c.query_heads, c.head_dim).transpose(1, 0, 2)
    k = (h @ w["layers.0.wk.weight"].T).reshape(n, c.kv_heads, c.head_dim).transpose(1, 0, 2)
    cos, sin = numpy_model.rope_tables(np.arange(n), c.head_dim, c.rope_base)
    q, k = numpy_model.apply_rope(q, cos, sin), numpy_model.apply_rope(k, cos, sin)
    k = np.repeat(k, c.group_size, axis=0)  # query head h reads KV head h // r
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(c.head_dim)
    scores = np.where(np.triu(np.ones((n, n), bool), 1)[None], -np.inf, scores)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    return probs / probs.sum(axis=-1, keepdims=True)


class CaptureTest(unittest.TestCase):
    T = 200

    def setUp(self):
        self.model = random_model(3)
        self.example = tasks.make_example("multi_value", self.T, 9, depth=0.3)

    def test_rows_are_probability_rows_over_the_causal_prefix(self):
        c = self.model.config
        arrays = capture_trace.capture(self.model, self.example.prompt)
        for name in ("stats", "accumulated"):
            a = arrays[name]
            self.assertEqual(a.shape, (c.layers, c.query_heads, self.T), name)
            self.assertEqual(a.dtype, np.float32, name)
            self.assertTrue(np.all(a >= 0), name)
            np.testing.assert_allclose(a.sum(axis=-1), 1.0, atol=1e-5, err_msg=name)
        attention = layer0_attention(self.model, self.example.prompt)
        # LAST_ROW: the last query's row; ACCUMULATED: column sums over every query / T.
        np.testing.assert_allclose(arrays["stats"][0], attention[:, -1, :], atol=2e-5)
        np.testing.assert_allclose(arrays["accumulated"][0], attention.mean(axis=1), atol=2e-5)
        # The accumulated mass of key j comes only from queries i >= j: the first key collects
        # the whole first row (1.0) plus its share of the others, the last key only 1/T of one.
        acc = arrays["accumulated"][0]
        np.testing.assert_allclose(acc[:, -1], attention[:, -1, -1] / self.T, atol=1e-6)

    def test_every_layer_matches_what_a_worker_sends(self):
        # The worker sends on_layer's statistic (stat_rows = 1 for LAST_ROW, W for WINDOW_MEAN);
        # the trace must hold the same rows in every layer.
        for statistic, rows in (("last_row", 1), ("window_mean", 16)):
            arrays = capture_trace.capture(self.model, self.example.prompt, statistic, window=16,
                                           accumulated=False)
            sent = {}
            self.model.step(self.example.prompt, np.arange(self.T),
                            numpy_model.DenseKV(self.model.config), stat_rows=rows,
                            on_layer=lambda layer, stat: sent.setdefault(layer, stat))
            for layer, per_group in sent.items():
                np.testing.assert_array_equal(arrays["stats"][layer],
                                              np.concatenate(per_group, axis=0))

    def test_window_mean_is_the_mean_of_the_last_rows(self):
        arrays = capture_trace.capture(self.model, self.example.prompt, "window_mean", window=8,
                                       accumulated=False)
        self.assertNotIn("accumulated", arrays)
        attention = layer0_attention(self.model, self.example.prompt)
        np.testing.assert_allclose(arrays["stats"][0], attention[:, -8:, :].mean(axis=1),
                                   atol=2e-5)
        # Key T-1 is in the causal prefix of the last query only.
        np.testing.assert_allclose(arrays["stats"][0][:, -1], attention[:, -1, -1] / 8, atol=1e-6)

    def test_capture_is_deterministic(self):
        with tempfile.TemporaryDirectory() as tmp:
            dirs = [os.path.join(tmp, name) for name in ("a", "b")]
            for d in dirs:
                # A fresh model object each time: nothing carries over between captures.
                capture_trace.capture_example(random_model(3), d, "multi_value", self.T, 9, 0.3,
                                              "ab" * 32)
            for name in ("stats.npy", "accumulated.npy", "trace.json"):
                self.assertTrue(filecmp.cmp(os.path.join(dirs[0], name),
                                            os.path.join(dirs[1], name), shallow=False), name)

    def test_trace_files_follow_the_format(self):
        c = self.model.config
        with tempfile.TemporaryDirectory() as tmp:
            capture_trace.capture_example(self.model, tmp, "multi_value", self.T, 9, 0.3,
                                          "cd" * 32)
            with open(os.path.join(tmp, "trace.json")) as f:
                meta = json.load(f)
            stats = np.load(os.path.join(tmp, "stats.npy"))
        self.assertEqual(meta["format"], "entrokv-trace")
        self.assertEqual(meta["version"], 1)
        self.assertEqual(meta["model"], {"name": capture_trace.MODEL_NAME, "layers": c.layers,
                                         "query_heads": c.query_heads, "kv_groups": c.kv_heads,
                                         "head_dim": c.head_dim})
        self.assertEqual(meta["tokens"], self.T)
        self.assertEqual(meta["statistic"], "last_row")
        self.assertTrue(meta["accumulated"])
        self.assertEqual(meta["sink_tokens"], 4)
        self.assertEqual(stats.shape, (c.layers, c.query_heads, self.T))
        self.assertEqual(stats.dtype, np.float32)
        spans = [(n["begin"], n["end"]) for n in meta["needles"]]
        self.assertEqual(spans, [tuple(s) for s in self.example.needle_spans])
        self.assertEqual(len(spans), 3)  # multi_value: every value of the key
        for needle in meta["needles"]:
            self.assertTrue(0 <= needle["begin"] < needle["end"] <= self.T)
            self.assertAlmostEqual(needle["depth"], needle["begin"] / self.T, places=3)
        for word in ("entrokv-gqa-small", "sha256=" + "cd" * 8, "task=multi_value",
                     "length=200", "seed=9", "depth=0.3000"):
            self.assertIn(word, meta["source"])
        self.assertEqual(meta["capture"]["answer"], [int(t) for t in self.example.answer])

    def test_bad_statistic_is_refused(self):
        with self.assertRaisesRegex(ValueError, "statistic must be one of"):
            capture_trace.capture(self.model, self.example.prompt, "accumulated")


if __name__ == "__main__":
    unittest.main()
