"""The client's retries are the channel's service-config retryPolicy: UNAVAILABLE only.

What the retries are for is a daemon restart, so RestartTest stops the real entrokvd and starts
it again on the same port and --state_dir while a call is being retried. The exact attempt
counts (bounded, other codes not retried, streams not retried) need a server that answers
UNAVAILABLE on demand, which entrokvd does only while draining: a small in-process gRPC server
plays that part in RetryPolicyTest, counting attempts. ReconnectTest checks that the channel
re-dials on the retries' schedule, against a port that accepts and drops every connection.
"""

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest
from concurrent import futures

import grpc
import numpy as np

import entrokv
from entrokv.v1 import cache_manager_pb2 as pb
from entrokv.v1 import cache_manager_pb2_grpc as pb_grpc
from entrokv.v1 import types_pb2 as types


class FlakyServicer(pb_grpc.CacheManagerServicer):
    """GetPoolStats fails with `code` for the first `failures` calls, then answers."""

    def __init__(self):
        self.lock = threading.Lock()
        self.attempts = 0
        self.failures = 0
        self.code = grpc.StatusCode.UNAVAILABLE

    def GetPoolStats(self, request, context):
        with self.lock:
            self.attempts += 1
            fail = self.attempts <= self.failures
        if fail:
            context.abort(self.code, "not now")
        return types.PoolStats(model_id=request.model_id, capacity_frames=8, free_frames=8)

    def DecideStream(self, request_iterator, context):
        with self.lock:
            self.attempts += 1
        for _ in request_iterator:
            pass
        context.abort(grpc.StatusCode.UNAVAILABLE, "draining")


class RetryPolicyTest(unittest.TestCase):
    def setUp(self):
        self.servicer = FlakyServicer()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_CacheManagerServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def tearDown(self):
        self.server.stop(grace=None)

    def client(self, max_attempts):
        return entrokv.Client(f"127.0.0.1:{self.port}", timeout_s=10, max_attempts=max_attempts)

    def test_unavailable_is_retried_until_it_succeeds(self):
        self.servicer.failures = 2
        with self.client(4) as client:
            stats = client.pool_stats("m")
        self.assertEqual((stats.model_id, stats.free_frames), ("m", 8))
        self.assertEqual(self.servicer.attempts, 3)

    def test_attempts_are_bounded_and_the_last_error_is_raised(self):
        self.servicer.failures = 10
        with self.client(3) as client, self.assertRaises(entrokv.UnavailableError) as raised:
            client.pool_stats("m")
        self.assertEqual(raised.exception.message, "not now")
        self.assertEqual(self.servicer.attempts, 3)

    def test_one_attempt_means_no_retry(self):
        self.servicer.failures = 1
        with self.client(1) as client, self.assertRaises(entrokv.UnavailableError):
            client.pool_stats("m")
        self.assertEqual(self.servicer.attempts, 1)

    def test_other_codes_are_not_retried(self):
        self.servicer.failures = 1
        self.servicer.code = grpc.StatusCode.RESOURCE_EXHAUSTED
        with self.client(4) as client, self.assertRaises(entrokv.ResourceExhaustedError):
            client.pool_stats("m")
        self.assertEqual(self.servicer.attempts, 1)

    def test_decide_stream_is_not_retried(self):
        stats = np.full((2, 32), 1 / 32, dtype=np.float32)
        with self.client(4) as client, self.assertRaises(entrokv.UnavailableError):
            list(client.decide_stream("m", "s", [(0, stats)], pages=1))
        self.assertEqual(self.servicer.attempts, 1)


class DecidingServicer(pb_grpc.CacheManagerServicer):
    """Decide and DecideStream answer with `code` (OK: one empty decision per layer), after
    `delay_s`; a stream reads every layer first."""

    def __init__(self):
        self.code = grpc.StatusCode.OK
        self.delay_s = 0.0

    def _answer(self, context):
        time.sleep(self.delay_s)
        if self.code != grpc.StatusCode.OK:
            context.abort(self.code, "not now")

    def Decide(self, request, context):
        self._answer(context)
        return pb.DecideResponse(layers=[pb.LayerDecision(layer=l.layer) for l in request.layers])

    def DecideStream(self, request_iterator, context):
        layers = [message.layer.layer for message in request_iterator]
        self._answer(context)
        for layer in layers:
            yield pb.LayerDecision(layer=layer)


class FailOpenTest(unittest.TestCase):
    """try_decide and try_decide_stream: "no decision" (None) for UNAVAILABLE,
    DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED, within decision_timeout_s, counted and logged;
    every other error raised. (A real daemon killed and restarted under the pool-backed worker:
    eval/model/fail_open_test.py.)"""

    STATS = np.full((2, 4, 32), 1 / 32, dtype=np.float32)

    def setUp(self):
        self.servicer = DecidingServicer()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_CacheManagerServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.addCleanup(self.server.stop, None)
        self.client = entrokv.Client(f"127.0.0.1:{self.port}", decision_timeout_s=0.3)
        self.addCleanup(self.client.close)

    def decide(self):
        return self.client.try_decide("m", "s", self.STATS, pages=1)

    def decide_stream(self):
        return self.client.try_decide_stream("m", "s", list(enumerate(self.STATS)), pages=1)

    def test_a_decision_in_time_is_returned(self):
        self.assertEqual([d.layer for d in self.decide()], [0, 1])
        self.assertEqual([d.layer for d in self.decide_stream()], [0, 1])
        self.assertEqual(sum(self.client.no_decisions.values()), 0)

    def test_no_decision_codes_give_none_counted_and_logged(self):
        for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
            self.servicer.code = code
            for call in (self.decide, self.decide_stream):
                with self.subTest(code=code.name, call=call.__name__), \
                        self.assertLogs("entrokv", "WARNING") as logged:
                    self.assertIsNone(call())
                self.assertIn("no decision for m/s", logged.output[0])
                self.assertIn(code.name, logged.output[0])
        self.assertEqual(self.client.no_decisions,
                         {"UNAVAILABLE": 2, "DEADLINE_EXCEEDED": 0, "RESOURCE_EXHAUSTED": 2})

    def test_a_slow_daemon_gives_none_once_the_decision_timeout_passed(self):
        self.servicer.delay_s = 2.0
        for call in (self.decide, self.decide_stream):
            with self.subTest(call=call.__name__), self.assertLogs("entrokv", "WARNING"):
                start = time.monotonic()
                self.assertIsNone(call())
                elapsed = time.monotonic() - start
            self.assertGreaterEqual(elapsed, 0.25)
            self.assertLess(elapsed, 1.5)
        self.assertEqual(self.client.no_decisions["DEADLINE_EXCEEDED"], 2)

    def test_other_errors_are_raised_and_not_counted(self):
        self.servicer.code = grpc.StatusCode.FAILED_PRECONDITION
        with self.assertRaises(entrokv.FailedPreconditionError):
            self.decide()
        with self.assertRaises(entrokv.FailedPreconditionError):
            self.decide_stream()
        with self.assertRaises(ValueError):  # a bad argument is still the caller's
            self.client.try_decide("m", "s", self.STATS)
        self.assertEqual(sum(self.client.no_decisions.values()), 0)

    def test_nobody_listening_gives_none_quickly(self):
        with entrokv.Client(f"127.0.0.1:{free_port()}", decision_timeout_s=0.5) as client:
            for call in (lambda: client.try_decide("m", "s", self.STATS, pages=1),
                         lambda: client.try_decide_stream("m", "s", list(enumerate(self.STATS)),
                                                          pages=1)):
                start = time.monotonic()
                self.assertIsNone(call())
                self.assertLess(time.monotonic() - start, 1.0)
            self.assertEqual(client.no_decisions["UNAVAILABLE"], 2)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Daemon:
    """entrokvd on 127.0.0.1:`port` with `state_dir`, started and stopped with SIGTERM."""

    def __init__(self, port: int, state_dir: str):
        self.process = subprocess.Popen(
            [os.environ["ENTROKVD"], f"--listen=127.0.0.1:{port}", "--metrics_listen=",
             f"--state_dir={state_dir}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stopped = False
        # Its first line says it is listening; EOF instead means it did not start.
        if not self.process.stdout.readline():
            raise RuntimeError(f"entrokvd did not start: {self.process.communicate()[1]}")

    def stop(self) -> int:
        self.stopped = True
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        self.process.stdout.close()
        self.process.stderr.close()
        return code

    def kill_unless_stopped(self) -> None:
        if not self.stopped:
            self.process.kill()
            self.stop()


class RestartTest(unittest.TestCase):
    def test_a_unary_call_is_carried_across_a_daemon_restart(self):
        port = free_port()
        with tempfile.TemporaryDirectory() as state_dir:
            first = Daemon(port, state_dir)
            self.addCleanup(first.kill_unless_stopped)
            # Closed before the stop: entrokvd's drain waits seconds for an idle connection.
            with entrokv.Client(f"127.0.0.1:{port}") as setup:
                setup.register_model("m", layers=2, query_heads=4, kv_groups=2, head_dim=8,
                                     capacity_bytes=1 << 20)
                setup.open_sequence("m", "s", initial_tokens=64)
            self.assertEqual(first.stop(), 0)

            # Backoffs of 0.5, 1, 2 and 4 s: the restart below has seconds to finish.
            client = entrokv.Client(f"127.0.0.1:{port}", timeout_s=60, max_attempts=5,
                                    initial_backoff_s=0.5)
            with client:
                # The call starts with no daemon there; the restart waits until its first
                # attempt has failed (the channel reports the refused connection).
                refused = threading.Event()

                def watch(state):
                    if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                        refused.set()

                client._channel.subscribe(watch, try_to_connect=False)
                outcome = {}

                def call():
                    try:
                        outcome["stats"] = client.pool_stats("m")
                    except entrokv.EntrokvError as error:
                        outcome["error"] = error

                caller = threading.Thread(target=call)
                caller.start()
                self.assertTrue(refused.wait(timeout=30), "the first attempt never failed")
                self.assertNotIn("stats", outcome)
                second = Daemon(port, state_dir)
                self.addCleanup(second.kill_unless_stopped)
                caller.join(timeout=60)
                client._channel.unsubscribe(watch)
            self.assertEqual(second.stop(), 0)
        self.assertNotIn("error", outcome)
        # The answer is the restarted daemon's, from the recovered state: 64 tokens are 4
        # pages in each of 2 layers x 2 groups.
        stats = outcome["stats"]
        self.assertEqual((stats.model_id, stats.sequences_active, stats.used_frames), ("m", 1, 16))


class ReconnectTest(unittest.TestCase):
    def test_the_channel_redials_on_the_retry_schedule(self):
        # Every connection is accepted and dropped at once, so each attempt fails UNAVAILABLE.
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        dials = []

        def accept():
            while True:
                try:
                    connection, _ = listener.accept()
                except OSError:
                    return
                dials.append(time.monotonic())
                connection.close()

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        port = listener.getsockname()[1]
        # The defaults: 4 attempts, backoffs of 0.05, 0.1 and 0.2 s (0.35 s in all). gRPC's own
        # reconnect backoff (1 s) would leave the channel failing fast through all of them,
        # on one connection: a daemon back within the retries could never be reached.
        with entrokv.Client(f"127.0.0.1:{port}") as client, \
                self.assertRaises(entrokv.UnavailableError):
            client.pool_stats("m")
        listener.close()
        self.assertGreaterEqual(len(dials), 2)


if __name__ == "__main__":
    unittest.main()
