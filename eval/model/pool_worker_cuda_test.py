"""The CUDA pool worker's logic on the CPU, against a real entrokvd on loopback: CudaPoolWorker
with only what needs a GPU replaced (its arena is the host arena seen as a torch tensor, and
its statistic buffer is sent as bytes instead of a device buffer), run next to the host worker
on the same prompts and policies. It must give the same answers, keep the same pages of every
(layer, group) and as many frames, with every frame no sequence names poisoned with NaN after
each decision. What this leaves to the GPU (map_arena, DeviceBuffer, the daemon mapping the
buffer) is run by bench/gpu/worker_checks.sh. Skipped without PyTorch."""
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402
from pool_worker_test import DaemonFixture  # noqa: E402

try:
    import torch  # noqa: E402
    import entrokv  # noqa: E402
    import pool_worker  # noqa: E402
    import pool_worker_cuda  # noqa: E402
    from pool_worker import Policy  # noqa: E402
except ImportError:  # no torch, or the client package is not on the path
    torch = None


class BytesExport:
    """DeviceBuffer's place on the CPU: the view's values, sent as bytes."""

    def __init__(self, flat, generation=0):
        self.flat, self.generation = flat, generation

    def statistic(self, view):
        assert view.data_ptr() >= self.flat.data_ptr()  # a view of the worker's one buffer
        return view.clone().numpy()


if torch is not None:
    class CpuTwin(pool_worker_cuda.CudaPoolWorker):
        BACKEND = "host"
        EXPORTER = BytesExport

        def _open_arena(self, pool, element):
            host = pool_worker.HostArena(pool, element)
            return pool_worker_cuda.TorchArena(torch.from_numpy(host.frames), owner=host)


@unittest.skipIf(torch is None or "ENTROKVD" not in os.environ or
                 "ENTROKV_CLI" not in os.environ,
                 "needs PyTorch, ENTROKVD, ENTROKV_CLI and the client on PYTHONPATH (ctest)")
class CudaWorkerOnCpuTest(DaemonFixture, unittest.TestCase):
    def test_same_answers_and_kept_pages_as_the_host_worker_with_free_frames_poisoned(self):
        example = tasks.make_example("multi_key", 300, 2)
        for layout in ("group", "layer"):
            host = pool_worker.PoolWorker(self.client, self.model, self.registry,
                                          model_id=f"host-{layout}", frame_layout=layout,
                                          capacity_frames=512)
            twin = CpuTwin(self.client, self.model, self.registry, device="cpu",
                           model_id=f"twin-{layout}", frame_layout=layout, capacity_frames=512)
            try:
                for policy in (Policy("none"), Policy("page_entrokv", pages=5),
                               Policy("h2o", ratio=0.75)):
                    with self.subTest(layout=layout, policy=policy.label()):
                        poisoned = []

                        def poison(kv, decisions):
                            used = {int(f) for s in self.client.list_sequences(
                                        twin.model_id, block_tables=True)
                                    for t in s.block_tables for f in t.frames if f >= 0}
                            free = sorted(set(range(twin.pool.capacity_frames)) - used)
                            twin.arena.poison(free)
                            poisoned.append(len(free))

                        expected = host.run_prompt(example, policy, max_new=6)
                        got = twin.run_prompt(example, policy, max_new=6, on_decided=poison)
                        self.assertEqual(got.answer, expected.answer)
                        self.assertEqual(got.kept_frames, expected.kept_frames)
                        self.assertEqual(
                            [[list(g.kept_pages) for g in d.groups] for d in got.decisions],
                            [[list(g.kept_pages) for g in d.groups] for d in expected.decisions])
                        self.assertTrue(np.all(np.isfinite(got.logits)))
                        np.testing.assert_allclose(got.logits, expected.logits, rtol=1e-3,
                                                   atol=1e-3)
                        if policy.name != "none":
                            self.assertGreater(poisoned[0], 0)
            finally:
                host.close(unregister=True)
                twin.close(unregister=True)

    def test_a_kept_frame_poisoned_is_noticed(self):
        # The control: NaN in one frame the sequence still names reaches the logits.
        example = tasks.make_example("multi_key", 300, 2)
        twin = CpuTwin(self.client, self.model, self.registry, device="cpu",
                       model_id="twin-control", capacity_frames=512)
        try:
            def poison_kept(kv, decisions):
                twin.arena.poison([kv.tables[1, 0, decisions[1].groups[0].kept_pages[0]]])

            result = twin.run_prompt(example, Policy("page_entrokv", pages=5), max_new=3,
                                     on_decided=poison_kept)
            self.assertTrue(np.all(np.isnan(result.logits[1:])))
        finally:
            twin.close(unregister=True)


if __name__ == "__main__":
    unittest.main()
