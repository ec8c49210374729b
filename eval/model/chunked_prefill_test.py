"""The chunked-prefill measurement's own prefill (chunked_prefill.py) against a real entrokvd.

Random weights of the real shapes. What its numbers rest on: with nothing evicted, the chunks'
column sums add up to the whole prompt's ACCUMULATED statistic and the logits are the whole
prefill's; with eviction, every chunk's decision keeps exactly K pages per (layer, group), the
columns of evicted pages are zero, and the peak is K plus one chunk's pages. ENTROKVD,
ENTROKV_CLI and PYTHONPATH as for pool_worker_test (ctest sets them).
"""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import policies  # noqa: E402
import tasks  # noqa: E402
from model_test import random_model  # noqa: E402

try:
    import entrokv  # noqa: E402
    import chunked_prefill  # noqa: E402
    import pool_worker  # noqa: E402
except ImportError:  # the client package is not on the path: run through ctest
    entrokv = None


@unittest.skipIf(entrokv is None or "ENTROKVD" not in os.environ or
                 "ENTROKV_CLI" not in os.environ,
                 "needs ENTROKVD, ENTROKV_CLI and the client package on PYTHONPATH (run through "
                 "ctest)")
class ChunkedPrefillTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = pool_worker.LocalDaemon(os.environ["ENTROKVD"])
        cls.client = entrokv.Client(cls.daemon.address, timeout_s=60)
        cls.worker = pool_worker.PoolWorker(cls.client, random_model(),
                                            policies.load(os.environ["ENTROKV_CLI"]),
                                            model_id="chunked", capacity_frames=2048)
        cls.example = tasks.make_example("multi_key", 250, 4)

    @classmethod
    def tearDownClass(cls):
        cls.worker.close(unregister=True)
        cls.client.close()
        if cls.daemon.stop() != 0:
            raise AssertionError("entrokvd did not exit 0 after SIGTERM")

    def chunked(self, chunk, pages):
        sent = []
        decide = self.client.decide

        def recording(model_id, sequence_id, stats, **kwargs):
            # The statistic, and the pages the sequence held when it was computed.
            (info,) = [i for i in self.client.list_sequences(model_id, block_tables=True)
                       if i.sequence_id == sequence_id]
            sent.append((np.array(stats), {(t.layer, t.group): np.flatnonzero(t.frames >= 0)
                                           for t in info.block_tables}))
            self.assertTrue(kwargs["accumulate"])
            return decide(model_id, sequence_id, stats, **kwargs)

        self.client.decide = recording
        try:
            kv, peak = chunked_prefill.chunked_prefill(
                self.worker, self.example.prompt, chunk, pool_worker.Policy("h2o", pages=pages))
        finally:
            del self.client.decide
        self.addCleanup(self.worker.close_sequence, kv)
        return kv, peak, sent

    def test_without_eviction_the_chunks_add_up_to_the_whole_prompt(self):
        whole, _ = self.worker.prefill(self.example.prompt, kinds=("accumulated",))
        self.addCleanup(self.worker.close_sequence, whole)
        kv, peak, sent = self.chunked(64, pages=1000)  # keeps every page
        self.assertEqual([s.shape[2] for s, _ in sent], [64, 128, 192, 250])
        total = np.zeros_like(whole.stats["accumulated"])
        for chunk, _ in sent:
            total[:, :, :chunk.shape[2]] += chunk
        np.testing.assert_allclose(total, whole.stats["accumulated"], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(kv.prefill_logits[-1], whole.prefill_logits[-1],
                                   rtol=1e-4, atol=1e-4)
        self.assertEqual(peak, whole.live_frames())
        self.assertEqual(kv.live_frames(), whole.live_frames())

    def test_each_chunk_keeps_k_pages_and_the_peak_is_k_plus_a_chunk(self):
        c = self.worker.model.config
        kv, peak, sent = self.chunked(64, pages=4)
        for g in range(c.kv_heads):
            self.assertEqual(int((kv.tables[:, g, :16] >= 0).sum()), 4 * c.layers)
        # Before the last chunk's decision: 4 kept pages and the chunk's 4 (250 = 3 x 64 + 58).
        self.assertEqual(peak, (4 + 4) * c.layers * c.kv_heads)
        # Every chunk's statistic is zero exactly off the pages the sequence held then, and
        # positive on them (attention reaches every key it can see).
        b = self.worker.page_size
        group_size = c.query_heads // c.kv_heads
        for stats, held in sent:
            for (layer, g), pages in held.items():
                heads = stats[layer, g * group_size:(g + 1) * group_size]
                seen = np.zeros(stats.shape[2], bool)
                for page in pages:
                    seen[page * b:(page + 1) * b] = True
                self.assertTrue(np.all(heads[:, ~seen] == 0))
                self.assertTrue(np.all(heads[:, seen] > 0))

    def test_the_summary_pairs_each_chunked_arm_with_the_decision_at_the_end(self):
        # Six prompts: the chunked arm alone answers 0, 1 and 2, the end arm alone answers 3.
        rows = []
        for arm, correct in (("none", [1] * 6), ("end", [0, 0, 0, 1, 1, 0]),
                             ("chunk64", [1, 1, 1, 0, 1, 0])):
            rows += [dict(policy="none" if arm == "none" else "h2o", arm=arm, task="multi_key",
                          prompt=str(i), correct=str(c), peak_frames="8", kept_frames="4")
                     for i, c in enumerate(correct)]
        table = chunked_prefill.summarize(rows, ["h2o"], [64])
        (line,) = [x for x in table.splitlines() if x.startswith("| h2o | chunk64 | 4/6 = ")]
        self.assertIn("+3 / -1 (p = 0.625)", line)
        (end,) = [x for x in table.splitlines() if x.startswith("| h2o | end | 2/6 = ")]
        self.assertTrue(end.endswith("| - |"), end)


if __name__ == "__main__":
    unittest.main()
