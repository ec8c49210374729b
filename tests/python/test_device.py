"""entrokv.device (statistics in GPU memory, the cuda arena) where no GPU is needed: argument
checks, the client carrying a device_buffer Statistic, and a real entrokvd refusing bad regions
by field and saying when it cannot map device memory. The mapping itself runs on a GPU
(bench/gpu/worker_checks.sh)."""

import os
import subprocess
import sys
import unittest

import numpy as np

import entrokv
from entrokv import device
from entrokv.v1 import types_pb2 as types

from test_client import Daemon

GEOMETRY = dict(layers=2, query_heads=4, kv_groups=2, head_dim=16, page_size=16)
TOKENS = 64


def region_statistic(length_bytes: int, handle: bytes = b"\x5a" * 64, offset: int = 0,
                     tokens: int = TOKENS) -> "types.Statistic":
    return types.Statistic(
        dtype=types.DTYPE_FLOAT32, query_heads=GEOMETRY["query_heads"], tokens=tokens,
        device_buffer=types.DeviceBufferRegion(cuda_ipc_handle=handle, offset_bytes=offset,
                                               length_bytes=length_bytes, generation=1))


class ArgumentTest(unittest.TestCase):
    def test_only_cuda_tensors_and_cupy_arrays_are_device_buffers(self):
        with self.assertRaisesRegex(TypeError, "expected a CUDA torch.Tensor or cupy.ndarray"):
            device.device_statistic(np.zeros((4, 8), np.float32))
        with self.assertRaisesRegex(ValueError, "generation: must be an int >= 0"):
            device.DeviceBuffer(np.zeros(3), generation=-1)

    def test_a_cpu_tensor_is_refused(self):
        try:
            import torch
        except ImportError:
            self.skipTest("no torch")
        with self.assertRaisesRegex(ValueError, "the tensor is on the CPU"):
            device.device_statistic(torch.zeros(4, 8))

    def test_an_ipc_handle_without_a_driver_says_so(self):
        try:
            import ctypes
            ctypes.CDLL("libcuda.so.1")
            self.skipTest("this host has a CUDA driver")
        except OSError:
            pass
        with self.assertRaisesRegex(RuntimeError, "no CUDA driver"):
            device._ipc_handle(0)

    def test_map_arena_needs_a_cuda_pool(self):
        host = entrokv.PoolInfo(model_id="m", geometry=None, frame_layout="group", backend="host",
                                capacity_bytes=1, capacity_frames=1, frame_bytes=1,
                                arena_name="/entrokv-x", cuda_ipc_handle=b"")
        with self.assertRaisesRegex(ValueError, "backend 'host'"):
            device.map_arena(host)
        cuda = entrokv.PoolInfo(model_id="m", geometry=None, frame_layout="group", backend="cuda",
                                capacity_bytes=64, capacity_frames=4, frame_bytes=16,
                                arena_name="", cuda_ipc_handle=b"\x01" * 10)
        with self.assertRaisesRegex(ValueError, "cuda_ipc_handle is 10 bytes"):
            device.map_arena(cuda)
        with self.assertRaisesRegex(ValueError, "rank: 1, but the pool lists no ranks"):
            device.map_arena(cuda, rank=1)

    def test_the_client_works_without_torch_or_cupy(self):
        code = ("import sys; sys.modules['torch'] = None; sys.modules['cupy'] = None\n"
                "import entrokv, numpy as np\n"
                "from entrokv.client import _layer_statistic\n"
                "print(_layer_statistic((0, np.ones((2, 3), np.float32)), None).layer)\n")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=60, env=dict(os.environ))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "0")


class DaemonTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.client = entrokv.Client(cls.daemon.address)
        cls.client.register_model("m", **GEOMETRY)
        cls.client.open_sequence("m", "s", TOKENS)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.stop()

    def kept(self):
        return [(table.layer, table.group, list(table.frames))
                for info in self.client.list_sequences("m", block_tables=True)
                for table in info.block_tables]

    def test_a_bad_region_is_refused_naming_the_field(self):
        before = self.kept()
        inline = np.random.default_rng(1).random((4, TOKENS), dtype=np.float32)
        with self.assertRaisesRegex(entrokv.InvalidArgumentError,
                                    r"layers\[1\]\.statistic\.device_buffer\.length_bytes: 12, "
                                    r"expected 1024"):
            self.client.decide("m", "s", [inline, region_statistic(12)], pages=1)
        with self.assertRaisesRegex(entrokv.InvalidArgumentError,
                                    r"layers\[0\]\.statistic\.device_buffer\.cuda_ipc_handle"):
            self.client.decide("m", "s", region_statistic(1024, handle=b"x"), pages=1)
        with self.assertRaisesRegex(entrokv.InvalidArgumentError,
                                    r"layer\.statistic\.device_buffer\.offset_bytes: 2 is not"):
            list(self.client.decide_stream("m", "s", [(0, region_statistic(1024, offset=2))],
                                           pages=1))
        self.assertEqual(self.kept(), before)

    def test_a_daemon_without_a_gpu_says_so(self):
        before = self.kept()
        refusals = (entrokv.UnavailableError, entrokv.FailedPreconditionError)
        with self.assertRaises(refusals) as raised:
            self.client.decide("m", "s", region_statistic(1024), layers=[1], pages=1)
        self.assertIn("layers[0].statistic.device_buffer", str(raised.exception))
        self.assertEqual(self.kept(), before)


if __name__ == "__main__":
    unittest.main()
