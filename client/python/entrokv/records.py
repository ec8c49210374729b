"""The typed records the client returns instead of raw protobuf messages.

Every record is a plain dataclass with the proto's field names; enums become their short
names ("group", "layer", "host", "cuda") and repeated numbers become numpy arrays where callers
index them (pages, frames) or lists otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np

from entrokv.v1 import types_pb2 as types

FRAME_LAYOUTS = {"group": types.FRAME_LAYOUT_GROUP, "layer": types.FRAME_LAYOUT_LAYER}
BACKENDS = {"host": types.BACKEND_HOST, "cuda": types.BACKEND_CUDA}
SELECTION_SCOPES = {"group": types.SELECTION_SCOPE_GROUP, "layer": types.SELECTION_SCOPE_LAYER}
STATISTIC_KINDS = {"last_row": types.STATISTIC_KIND_LAST_ROW,
                   "window_mean": types.STATISTIC_KIND_WINDOW_MEAN,
                   "accumulated": types.STATISTIC_KIND_ACCUMULATED}


def _name(table: dict, value: int) -> str:
    for name, number in table.items():
        if number == value:
            return name
    return "unspecified"


@dataclasses.dataclass
class ModelGeometry:
    layers: int
    query_heads: int
    kv_groups: int
    head_dim: int
    page_size: int
    element_bytes: int

    @classmethod
    def from_message(cls, message) -> "ModelGeometry":
        return cls(layers=message.layers, query_heads=message.query_heads,
                   kv_groups=message.kv_groups, head_dim=message.head_dim,
                   page_size=message.page_size, element_bytes=message.element_bytes)


@dataclasses.dataclass
class PoolInfo:
    """A registered model's pool (RegisterModel, GetModel, ListModels)."""
    model_id: str
    geometry: ModelGeometry
    frame_layout: str  # "group" or "layer"
    backend: str  # "host" or "cuda"
    capacity_bytes: int
    capacity_frames: int
    frame_bytes: int
    arena_name: str  # the shared-memory segment of a host pool
    cuda_ipc_handle: bytes  # cudaIpcMemHandle_t of a cuda pool, else empty

    @classmethod
    def from_message(cls, message) -> "PoolInfo":
        return cls(model_id=message.model_id,
                   geometry=ModelGeometry.from_message(message.geometry),
                   frame_layout=_name(FRAME_LAYOUTS, message.frame_layout),
                   backend=_name(BACKENDS, message.backend),
                   capacity_bytes=message.capacity_bytes,
                   capacity_frames=message.capacity_frames,
                   frame_bytes=message.frame_bytes,
                   arena_name=message.arena_name,
                   cuda_ipc_handle=bytes(message.cuda_ipc_handle))


def frame_assignments(messages) -> np.ndarray:
    """FrameAssignment messages as int32 rows (layer, group, page, frame), shape [n, 4]."""
    rows = [(m.layer, m.group, m.page, m.frame) for m in messages]
    return np.asarray(rows, dtype=np.int32).reshape(len(rows), 4)


@dataclasses.dataclass
class BlockTable:
    layer: int
    group: int
    frames: np.ndarray  # int32, one entry per logical page; -1 where the page was evicted


@dataclasses.dataclass
class SequenceInfo:
    """An open sequence (OpenSequence, ListSequences)."""
    sequence_id: str
    length_tokens: int
    live_frames: int
    block_tables: List[BlockTable]  # empty unless asked for

    @classmethod
    def from_message(cls, message) -> "SequenceInfo":
        return cls(sequence_id=message.sequence_id, length_tokens=message.length_tokens,
                   live_frames=message.live_frames,
                   block_tables=[BlockTable(layer=t.layer, group=t.group,
                                            frames=np.asarray(t.frames, dtype=np.int32))
                                 for t in message.block_tables])


@dataclasses.dataclass
class PoolStats:
    """A pool's occupancy; used_frames + free_frames == capacity_frames always."""
    model_id: str
    capacity_frames: int
    used_frames: int
    free_frames: int
    frame_bytes: int
    capacity_bytes: int
    sequences_active: int
    used_frames_per_layer: List[int]
    pages_evicted_total: int
    frames_freed_total: int
    bytes_moved_total: int
    bookkeeping_bytes: int  # daemon memory the pool's bookkeeping holds (accounted)

    @classmethod
    def from_message(cls, message) -> "PoolStats":
        return cls(model_id=message.model_id, capacity_frames=message.capacity_frames,
                   used_frames=message.used_frames, free_frames=message.free_frames,
                   frame_bytes=message.frame_bytes, capacity_bytes=message.capacity_bytes,
                   sequences_active=message.sequences_active,
                   used_frames_per_layer=list(message.used_frames_per_layer),
                   pages_evicted_total=message.pages_evicted_total,
                   frames_freed_total=message.frames_freed_total,
                   bytes_moved_total=message.bytes_moved_total,
                   bookkeeping_bytes=message.bookkeeping_bytes)


@dataclasses.dataclass
class GroupDecision:
    group: int
    kept_pages: np.ndarray  # int32, ascending
    evicted_pages: np.ndarray  # int32, ascending
    weights: np.ndarray  # float64, per query head of the group
    entropies: np.ndarray  # float64, empty when cached weights were used
    shadow_uor: Optional[float]
    disagreement: Optional[float]
    retained_mass: Optional[float]


@dataclasses.dataclass
class LayerDecision:
    layer: int
    tokens: int
    page_count: int
    quota_pages: int
    policy: str
    groups: List[GroupDecision]
    freed_frames: np.ndarray  # int32
    page_union_ratio: float
    scope: str  # "group" or "layer": the selection scope that decided
    union_pages: int  # distinct pages kept over the groups (the layer's frames, layer layout)
    group_scope_union_pages: int  # what per-group selection keeps or would have kept
    degraded: bool = False  # decided by position, the deadline too short to score it

    @classmethod
    def from_message(cls, message) -> "LayerDecision":
        def optional(group, field: str) -> Optional[float]:
            return getattr(group, field) if group.HasField(field) else None

        groups = [
            GroupDecision(
                group=g.group,
                kept_pages=np.asarray(g.kept_pages, dtype=np.int32),
                evicted_pages=np.asarray(g.evicted_pages, dtype=np.int32),
                weights=np.asarray(g.weights, dtype=np.float64),
                entropies=np.asarray(g.entropies, dtype=np.float64),
                shadow_uor=optional(g, "shadow_uor"),
                disagreement=optional(g, "disagreement"),
                retained_mass=optional(g, "retained_mass"),
            )
            for g in message.groups
        ]
        return cls(layer=message.layer, tokens=message.tokens, page_count=message.page_count,
                   quota_pages=message.quota_pages, policy=message.policy, groups=groups,
                   freed_frames=np.asarray(message.freed_frames, dtype=np.int32),
                   page_union_ratio=message.page_union_ratio,
                   scope=_name(SELECTION_SCOPES, message.scope),
                   union_pages=message.union_pages,
                   group_scope_union_pages=message.group_scope_union_pages,
                   degraded=message.degraded)
