#!/usr/bin/python3
"""The pool worker on a GPU: the small model in PyTorch on CUDA, its KV cache the daemon's CUDA
arena, its statistics sent as device buffers.

pool_worker.PoolWorker with its backend's methods replaced: the pool is registered with backend
"cuda" (entrokvd allocates the arena on the GPU), the worker maps it through its IPC handle
(entrokv.map_arena) as a tensor of frames and writes every layer's K and V into the frames the
block tables name, exactly as the host worker writes into the shared-memory arena; the forward
is torch_model.TorchModel (numpy_model's, step for step); each layer's statistic is written into
one device buffer of the worker's, exported once (entrokv.DeviceBuffer), and DecideStream carries
its IPC handle and offset instead of the values (docs/service.md, "Statistics in GPU memory").
Attention reads only the pages the tables still name, from the arena.

The statistic buffer is one per worker: prefills that decide take turns on it (a lock), and a
longer prompt than it holds replaces it with a larger one under the next generation. Statistics
kept for later decisions (prefill without a policy, forks) are copied to the host and sent as
bytes.

Needs torch with CUDA, cupy (map_arena) and a daemon that can allocate a CUDA arena. Run on a
GPU by bench/gpu/worker_checks.sh (cuda_worker_check.py compares it with the host worker).
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Optional

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_model  # noqa: E402
import pool_worker  # noqa: E402
import torch_model  # noqa: E402

import entrokv  # noqa: E402

TORCH_ELEMENTS = {"f32": ("float32", torch.float32), "f16": ("float16", torch.float16)}


class TorchArena:
    """An arena as a tensor of frames, [capacity_frames, groups_per_frame, 2 (K, V), page_size,
    head_dim], with pool_worker.HostArena's store/load/slot/close: K/V go in and out as tensors
    on the frames' device. CudaArena maps a cuda pool's; the CPU test wraps a host arena."""

    def __init__(self, frames: torch.Tensor, owner=None):
        self.frames = frames
        self.groups_per_frame = frames.shape[1]
        self.device = frames.device
        self._owner = owner  # what keeps the memory mapped

    def slot(self, group: int) -> int:
        return group if self.groups_per_frame > 1 else 0

    def _index(self, values) -> torch.Tensor:
        return torch.from_numpy(np.asarray(values, np.int64)).to(self.device)

    def store(self, frames: np.ndarray, slot: int, slots: np.ndarray, k, v) -> None:
        f, s = self._index(frames), self._index(slots)
        self.frames[f, slot, 0, s] = k.to(self.frames.dtype)
        self.frames[f, slot, 1, s] = v.to(self.frames.dtype)

    def load(self, frames: np.ndarray, slot: int, keep: Optional[np.ndarray]):
        block = self.frames[self._index(frames), slot]  # [pages, 2, B, D], a copy
        d = block.shape[-1]
        k, v = block[:, 0].reshape(-1, d), block[:, 1].reshape(-1, d)
        if keep is not None:
            mask = torch.from_numpy(np.asarray(keep, bool)).to(self.device)
            k, v = k[mask], v[mask]
        return k.float(), v.float()

    def poison(self, frames) -> None:
        """Fills `frames` with NaN (the check that nothing reads a frame it does not hold)."""
        if len(frames):
            self.frames[self._index(frames)] = float("nan")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self.frames = None
        if hasattr(self._owner, "close"):
            self._owner.close()
        self._owner = None


def CudaArena(pool: entrokv.PoolInfo, element: str) -> TorchArena:
    """A cuda pool's arena mapped into this process (entrokv.map_arena), over the daemon's GPU
    memory: writes land in its frames, reads see what any worker wrote there."""
    if pool.backend != "cuda":
        raise ValueError(f"backend: this worker maps cuda arenas, got {pool.backend}")
    g = pool.geometry
    name, dtype = TORCH_ELEMENTS[element]
    if torch.empty((), dtype=dtype).element_size() != g.element_bytes:
        raise ValueError(f"element {element}: the pool stores {g.element_bytes}-byte elements")
    groups = g.kv_groups if pool.frame_layout == "layer" else 1
    shape = (pool.capacity_frames, groups, 2, g.page_size, g.head_dim)
    raw = entrokv.map_arena(pool, dtype=name)  # [frames, frame elements]
    if raw.shape[1] != int(np.prod(shape[1:])):
        raise ValueError(f"frame_bytes {pool.frame_bytes} does not match {shape[1:]} {name}")
    return TorchArena(raw.view(shape), owner=raw)


class CudaPoolWorker(pool_worker.PoolWorker):
    """PoolWorker on the GPU (see the module's docstring). `model` is the numpy model: its
    weights go to `device` as a TorchModel."""

    BACKEND = "cuda"
    EXPORTER = entrokv.DeviceBuffer  # exports the statistic buffer (the CPU test's is a fake)

    def __init__(self, client: entrokv.Client, model: numpy_model.Model, registry, *,
                 device: str = "cuda", **kwargs):
        self._stat_lock = threading.Lock()
        self._flat: Optional[torch.Tensor] = None  # the statistic buffer, float32
        self._export: Optional[entrokv.DeviceBuffer] = None
        self._retired = []  # earlier buffers: a daemon may still hold them mapped
        self._generation = 0
        super().__init__(client, torch_model.TorchModel(model, device), registry, **kwargs)

    # -- the backend's methods --
    def _open_arena(self, pool, element):
        return CudaArena(pool, element)

    def _statistic_rows(self, groups: list):
        return torch.cat(groups, dim=0)

    def _kept(self, statistic) -> np.ndarray:
        return statistic.float().cpu().numpy()

    def _outgoing(self, kv, layer: int, statistic):
        """The layer's statistic copied into its place in the worker's device buffer, sent as
        a device_buffer Statistic (its IPC handle, offset and generation)."""
        heads, n = statistic.shape
        view = self._flat[layer * heads * n:(layer + 1) * heads * n].view(heads, n)
        view.copy_(statistic)
        return self._export.statistic(view)  # waits for the copy

    def _ensure_buffer(self, values: int) -> None:
        if self._flat is not None and self._flat.numel() >= values:
            return
        if self._flat is not None:
            self._retired.append((self._flat, self._export))
            self._generation += 1
        self._flat = torch.empty(max(values, 1 << 16), dtype=torch.float32,
                                 device=self.model.device)
        self._export = self.EXPORTER(self._flat, generation=self._generation)

    def prefill(self, prompt, **kwargs):
        c = self.model.config
        with self._stat_lock:
            self._ensure_buffer(c.layers * c.query_heads * len(prompt))
            return super().prefill(prompt, **kwargs)
