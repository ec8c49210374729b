"""A fail-open worker outlives its cache manager: entrokvd is killed (SIGKILL) in the middle of
the pool-backed worker's run and started again on the same port and --state_dir.

The worker decides through the client's fail-open stream and waits for the daemon on the calls
it cannot do without (Client(wait_for_ready=True)). The daemon is killed just before one
prompt's decision, so that decision cannot be had: it comes back as "no decision" at once,
counted, and the prompt is answered with its cache as it was, exactly as if no policy had been
asked for. The restart (after the worker has gone on without the decision) recovers the open
sequence, its block tables and the arena the worker has mapped; the decode waits for it, the
later prompts are decided again, and at the end no frame is left in use.

Random weights of the real shapes, short prompts: the run takes seconds. ENTROKVD, ENTROKV_CLI
and PYTHONPATH as for pool_worker_test (ctest sets them).
"""
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import policies  # noqa: E402
import tasks  # noqa: E402
from model_test import random_model  # noqa: E402

try:
    import entrokv  # noqa: E402
    import pool_worker  # noqa: E402
    from pool_worker import Policy  # noqa: E402
except ImportError:  # the client package is not on the path: run through ctest
    entrokv = None

PROMPTS, KILLED_AT, LENGTH, MAX_NEW = 6, 2, 200, 4
RESTART_AFTER_S = 1.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@unittest.skipIf(entrokv is None or "ENTROKVD" not in os.environ or
                 "ENTROKV_CLI" not in os.environ,
                 "needs ENTROKVD, ENTROKV_CLI and the client package on PYTHONPATH (run through "
                 "ctest)")
class FailOpenWorkerTest(unittest.TestCase):
    def setUp(self):
        state = tempfile.TemporaryDirectory()
        self.addCleanup(state.cleanup)
        self.args = (f"--state_dir={state.name}",)
        self.listen = f"127.0.0.1:{free_port()}"
        self.daemons = []
        self.addCleanup(self.kill_all)

    def start(self):
        daemon = pool_worker.LocalDaemon(os.environ["ENTROKVD"], *self.args, listen=self.listen)
        self.daemons.append(daemon)
        return daemon

    def kill_all(self):
        for daemon in self.daemons:
            if daemon.process.poll() is None:
                daemon.process.kill()
                daemon.process.wait()
            daemon.process.stdout.close()
            daemon.process.stderr.close()

    def test_every_prompt_is_answered_across_a_killed_daemon(self):
        first = self.start()
        client = entrokv.Client(self.listen, timeout_s=30, wait_for_ready=True,
                                decision_timeout_s=0.5)
        self.addCleanup(client.close)
        worker = pool_worker.PoolWorker(client, random_model(),
                                        policies.load(os.environ["ENTROKV_CLI"]),
                                        model_id="fail-open", capacity_frames=1024,
                                        fail_open=True)
        policy = Policy("page_entrokv", pages=4)
        examples = [tasks.make_example("multi_key", LENGTH, seed) for seed in range(PROMPTS)]
        # The answer the killed prompt must give: its cache as it was, no policy at all.
        kept_whole = worker.run_prompt(examples[KILLED_AT], Policy("none"), max_new=MAX_NEW)

        restarted = threading.Event()
        gone_for_s = []

        def kill_then_restart():
            first.process.send_signal(signal.SIGKILL)
            first.process.wait()
            killed = time.monotonic()

            def restart():
                time.sleep(RESTART_AFTER_S)
                self.start()
                gone_for_s.append(time.monotonic() - killed)
                restarted.set()

            threading.Thread(target=restart, daemon=True).start()

        decide_stream = worker._decide_stream
        decision_s = []

        def decide_stream_killing_once(kv, chosen, layer_stats):
            if len(decision_s) == KILLED_AT and not restarted.is_set() and len(
                    self.daemons) == 1:
                kill_then_restart()
            start = time.monotonic()
            decisions = decide_stream(kv, chosen, layer_stats)
            decision_s.append(time.monotonic() - start)
            return decisions

        worker._decide_stream = decide_stream_killing_once
        results = [worker.run_prompt(example, policy, max_new=MAX_NEW) for example in examples]
        self.assertTrue(restarted.is_set())

        # Every prompt answered; the killed one as if no policy had been asked for.
        self.assertEqual(len(results), PROMPTS)
        for result in results:
            self.assertEqual(len(result.logits), 1 + len(result.answer))
            self.assertTrue(np.all(np.isfinite(result.logits)))
        killed = results[KILLED_AT]
        self.assertEqual(killed.decisions, [])
        self.assertEqual(killed.kept_frames, killed.prompt_frames)
        self.assertEqual(killed.answer, kept_whole.answer)
        np.testing.assert_array_equal(killed.logits, kept_whole.logits)
        # "No decision" came at once (nobody listening), not after the restart.
        self.assertLess(decision_s[KILLED_AT], gone_for_s[0])
        self.assertLess(decision_s[KILLED_AT], 0.5 + 0.5)
        self.assertEqual(worker.no_decisions, 1)
        self.assertEqual(client.no_decisions["UNAVAILABLE"], 1)
        self.assertEqual(sum(client.no_decisions.values()), 1)

        # Decisions before the kill and after the restart: every layer decided, pages freed.
        layers = worker.model.config.layers
        for i, result in enumerate(results):
            if i == KILLED_AT:
                continue
            with self.subTest(prompt=i):
                self.assertEqual(len(result.decisions), layers)
                self.assertGreater(result.freed_frames, 0)
                self.assertLess(result.kept_frames, result.prompt_frames)

        # Nothing leaks: every sequence is closed and every frame back on the free list, in
        # the restarted daemon's recovered pool.
        stats = client.pool_stats(worker.model_id)
        self.assertEqual(stats.used_frames, 0)
        self.assertEqual(stats.free_frames, stats.capacity_frames)
        self.assertEqual(stats.sequences_active, 0)
        worker.close(unregister=True)
        client.close()
        self.assertEqual(self.daemons[-1].stop(), 0)


if __name__ == "__main__":
    unittest.main()
