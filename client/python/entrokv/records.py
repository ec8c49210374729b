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
NEIGHBOURHOOD_POOLINGS = {"max": types.NEIGHBOURHOOD_POOLING_MAX,
                          "mean": types.NEIGHBOURHOOD_POOLING_MEAN}
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
    arena_name: str  # the shared-memory segment of a host pool (rank 0's)
    cuda_ipc_handle: bytes  # cudaIpcMemHandle_t of a cuda pool (rank 0's), else empty
    # Tensor parallelism: each rank's arena, in rank order (one for a model on one device).
    ranks: List["RankArena"] = dataclasses.field(default_factory=list)

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
                   cuda_ipc_handle=bytes(message.cuda_ipc_handle),
                   ranks=[RankArena.from_message(rank) for rank in message.ranks])


@dataclasses.dataclass
class RankArena:
    """The arena of one tensor-parallel rank, which holds KV groups [rank G/t, (rank+1) G/t):
    frames [first_frame, first_frame + frames), frame f at (f - first_frame) * frame_bytes. The
    LAYER layout: every frame's slice of those groups (first_frame 0); the GROUP layout: the
    rank's own whole frames."""
    rank: int
    device: int  # the device it is on (a host arena: the device it stands in for)
    arena_name: str
    cuda_ipc_handle: bytes
    frame_bytes: int
    first_frame: int
    frames: int

    @classmethod
    def from_message(cls, message) -> "RankArena":
        return cls(rank=message.rank, device=message.device, arena_name=message.arena_name,
                   cuda_ipc_handle=bytes(message.cuda_ipc_handle),
                   frame_bytes=message.frame_bytes, first_frame=message.first_frame,
                   frames=message.frames)


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
class PressureInfo:
    """Pool pressure as a call saw it: the sequence's quota (0: none), its frames and floor, the
    pool's occupancy and target, the frames this call took from the sequence, and whether the
    daemon asks its owner to preempt it (close it, or swap it out)."""
    quota_frames: int = 0
    live_frames: int = 0
    floor_frames: int = 0
    occupancy: float = 0.0
    target_occupancy: float = 0.0
    reclaimed_frames: int = 0
    preempt: bool = False

    @classmethod
    def from_message(cls, message) -> "PressureInfo":
        return cls(quota_frames=message.quota_frames, live_frames=message.live_frames,
                   floor_frames=message.floor_frames, occupancy=message.occupancy,
                   target_occupancy=message.target_occupancy,
                   reclaimed_frames=message.reclaimed_frames, preempt=message.preempt)


ADMISSION_OUTCOMES = {"delayed": types.AdmissionHint.OUTCOME_DELAYED,
                      "refused": types.AdmissionHint.OUTCOME_REFUSED}


@dataclasses.dataclass
class AdmissionHint:
    """Why an admission got RESOURCE_EXHAUSTED (ResourceExhaustedError.admission): "delayed"
    (the frames are being reclaimed: retry after retry_after_ms) or "refused" (floors reached;
    preempt_sequence_ids were asked of their owners). Nothing was allocated."""
    outcome: str
    missing_frames: int
    reclaiming_frames: int
    retry_after_ms: int
    preempt_sequence_ids: List[str]

    @classmethod
    def from_message(cls, message) -> "AdmissionHint":
        return cls(outcome=_name(ADMISSION_OUTCOMES, message.outcome),
                   missing_frames=message.missing_frames,
                   reclaiming_frames=message.reclaiming_frames,
                   retry_after_ms=message.retry_after_ms,
                   preempt_sequence_ids=list(message.preempt_sequence_ids))


@dataclasses.dataclass
class SequenceInfo:
    """An open sequence (OpenSequence, ListSequences)."""
    sequence_id: str
    length_tokens: int
    live_frames: int
    block_tables: List[BlockTable]  # empty unless asked for
    tenant: str = ""
    priority: int = 0
    # The pool as the call saw it: not part of what the sequence is (left out of ==).
    pressure: PressureInfo = dataclasses.field(default_factory=PressureInfo, compare=False)

    @classmethod
    def from_message(cls, message) -> "SequenceInfo":
        return cls(sequence_id=message.sequence_id, length_tokens=message.length_tokens,
                   live_frames=message.live_frames,
                   block_tables=[BlockTable(layer=t.layer, group=t.group,
                                            frames=np.asarray(t.frames, dtype=np.int32))
                                 for t in message.block_tables],
                   tenant=message.tenant, priority=message.priority,
                   pressure=PressureInfo.from_message(message.pressure))


def evictions(messages) -> np.ndarray:
    """GroupEviction messages as int32 rows (layer, group, page), shape [n, 3]."""
    rows = [(m.layer, m.group, page) for m in messages for page in m.pages]
    return np.asarray(rows, dtype=np.int32).reshape(len(rows), 3)


@dataclasses.dataclass
class Appended:
    """An AppendTokens: the new length, the entries that became live (rows layer, group, page,
    frame), the pages a quota took from the sequence first (rows layer, group, page: read them
    no more) and the pool's pressure."""
    length_tokens: int
    new_frames: np.ndarray
    evicted: np.ndarray
    pressure: PressureInfo


@dataclasses.dataclass
class TenantUsage:
    tenant: str  # "" is the default tenant
    used_frames: int
    share: float
    guaranteed_frames: int


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
    # Pool pressure.
    target_occupancy: float = 0.0
    frames_reclaimed_admission_total: int = 0
    frames_reclaimed_target_total: int = 0
    admissions_delayed_total: int = 0
    admissions_refused_total: int = 0
    preemptions_total: int = 0
    sequences_swapped: int = 0
    swapped_bytes: int = 0
    tenants: List[TenantUsage] = dataclasses.field(default_factory=list)

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
                   bookkeeping_bytes=message.bookkeeping_bytes,
                   target_occupancy=message.target_occupancy,
                   frames_reclaimed_admission_total=message.frames_reclaimed_admission_total,
                   frames_reclaimed_target_total=message.frames_reclaimed_target_total,
                   admissions_delayed_total=message.admissions_delayed_total,
                   admissions_refused_total=message.admissions_refused_total,
                   preemptions_total=message.preemptions_total,
                   sequences_swapped=message.sequences_swapped,
                   swapped_bytes=message.swapped_bytes,
                   tenants=[TenantUsage(tenant=t.tenant, used_frames=t.used_frames, share=t.share,
                                        guaranteed_frames=t.guaranteed_frames)
                            for t in message.tenants])


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
    pressure: Optional[PressureInfo] = None  # DecideStream: the pool after this layer

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
                   degraded=message.degraded,
                   pressure=(PressureInfo.from_message(message.pressure)
                             if message.HasField("pressure") else None))
