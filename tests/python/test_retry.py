"""The client's retries are the channel's service-config retryPolicy: UNAVAILABLE only.

entrokvd cannot be made to answer UNAVAILABLE on demand (it does so only while draining), so a
small in-process gRPC server plays that part here; it counts attempts so the test is exact.
"""

import threading
import unittest
from concurrent import futures

import grpc
import numpy as np

import entrokv
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


if __name__ == "__main__":
    unittest.main()
