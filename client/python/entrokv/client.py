"""A typed wrapper over the generated gRPC stubs: numpy arrays in, numpy arrays out.

Statistics are numpy arrays [query_heads, tokens] (one layer) or [layers, query_heads, tokens]:
float32, float16, or bfloat16 stored as uint16 (pass dtype="bf16"). Errors raise EntrokvError
with the gRPC status code name (e.g. "INVALID_ARGUMENT") and the daemon's message.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterable, Iterator, Optional, Sequence

import grpc
import numpy as np

from entrokv.v1 import cache_manager_pb2 as pb
from entrokv.v1 import cache_manager_pb2_grpc as pb_grpc
from entrokv.v1 import types_pb2 as types

_DTYPES = {
    "f32": (types.DTYPE_FLOAT32, np.float32),
    "f16": (types.DTYPE_FLOAT16, np.float16),
    "bf16": (types.DTYPE_BFLOAT16, np.uint16),
}
_LAYOUTS = {"group": types.FRAME_LAYOUT_GROUP, "layer": types.FRAME_LAYOUT_LAYER}
_BACKENDS = {"host": types.BACKEND_HOST, "cuda": types.BACKEND_CUDA}


class EntrokvError(Exception):
    """A call failed; `code` is the gRPC status name, `message` the daemon's text."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


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
    groups: list
    freed_frames: np.ndarray  # int32
    page_union_ratio: float


def _optional(message, field: str) -> Optional[float]:
    return getattr(message, field) if message.HasField(field) else None


def _to_layer_decision(message) -> LayerDecision:
    groups = [
        GroupDecision(
            group=g.group,
            kept_pages=np.asarray(g.kept_pages, dtype=np.int32),
            evicted_pages=np.asarray(g.evicted_pages, dtype=np.int32),
            weights=np.asarray(g.weights, dtype=np.float64),
            entropies=np.asarray(g.entropies, dtype=np.float64),
            shadow_uor=_optional(g, "shadow_uor"),
            disagreement=_optional(g, "disagreement"),
            retained_mass=_optional(g, "retained_mass"),
        )
        for g in message.groups
    ]
    return LayerDecision(
        layer=message.layer,
        tokens=message.tokens,
        page_count=message.page_count,
        quota_pages=message.quota_pages,
        policy=message.policy,
        groups=groups,
        freed_frames=np.asarray(message.freed_frames, dtype=np.int32),
        page_union_ratio=message.page_union_ratio,
    )


def statistic_message(array: np.ndarray, dtype: Optional[str] = None) -> "types.Statistic":
    """One layer's [query_heads, tokens] array as a Statistic (bytes, no float lists)."""
    array = np.asarray(array)
    if array.ndim != 2:
        raise ValueError(f"statistic: expected [query_heads, tokens], got shape {array.shape}")
    if dtype is None:
        dtype = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}.get(array.dtype)
        if dtype is None:
            raise ValueError(
                f"statistic: dtype {array.dtype} is not float32 or float16; pass dtype='bf16' "
                "for bfloat16 stored as uint16")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {sorted(_DTYPES)}")
    wire_dtype, numpy_dtype = _DTYPES[dtype]
    data = np.ascontiguousarray(array, dtype=np.dtype(numpy_dtype).newbyteorder("<"))
    return types.Statistic(dtype=wire_dtype, query_heads=array.shape[0], tokens=array.shape[1],
                           kind=types.STATISTIC_KIND_LAST_ROW, data=data.tobytes())


def _budget(pages: Optional[int], fraction: Optional[float],
            token_slots: Optional[int]) -> "types.Budget":
    given = [value is not None for value in (pages, fraction, token_slots)]
    if sum(given) != 1:
        raise ValueError("budget: give exactly one of pages, fraction, token_slots")
    if pages is not None:
        return types.Budget(pages_per_group=pages)
    if fraction is not None:
        return types.Budget(fraction=fraction)
    return types.Budget(token_slots=token_slots)


class Client:
    """A connection to entrokvd. Calls retry on UNAVAILABLE only, with backoff."""

    def __init__(self, target: str = "127.0.0.1:50051", timeout_s: float = 10.0,
                 token: Optional[str] = None, max_attempts: int = 4,
                 max_message_bytes: int = 256 << 20):
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]
        self._channel = grpc.insecure_channel(target, options=options)
        self._stub = pb_grpc.CacheManagerStub(self._channel)
        self._timeout_s = timeout_s
        self._metadata = [("authorization", f"Bearer {token}")] if token else None
        self._max_attempts = max_attempts

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request):
        backoff_s = 0.05
        for attempt in range(1, self._max_attempts + 1):
            try:
                return method(request, timeout=self._timeout_s, metadata=self._metadata)
            except grpc.RpcError as error:
                code = error.code()
                if code == grpc.StatusCode.UNAVAILABLE and attempt < self._max_attempts:
                    time.sleep(backoff_s)
                    backoff_s *= 2
                    continue
                raise EntrokvError(code.name, error.details() or "") from None

    # --- models and sequences -------------------------------------------------------------

    def register_model(self, model_id: str, *, layers: int, query_heads: int, kv_groups: int,
                       head_dim: int, page_size: int = 16, element_bytes: int = 2,
                       capacity_bytes: int = 0, frame_layout: str = "group",
                       backend: str = "host"):
        """Creates the model's pool; returns its PoolInfo message."""
        geometry = types.ModelGeometry(layers=layers, query_heads=query_heads,
                                       kv_groups=kv_groups, head_dim=head_dim,
                                       page_size=page_size, element_bytes=element_bytes)
        request = pb.RegisterModelRequest(model_id=model_id, geometry=geometry,
                                          capacity_bytes=capacity_bytes,
                                          frame_layout=_LAYOUTS[frame_layout],
                                          backend=_BACKENDS[backend])
        return self._call(self._stub.RegisterModel, request).pool

    def get_model(self, model_id: str):
        return self._call(self._stub.GetModel, pb.GetModelRequest(model_id=model_id)).pool

    def list_models(self) -> list:
        """Every registered model's PoolInfo, ordered by model id."""
        return list(self._call(self._stub.ListModels, pb.ListModelsRequest()).pools)

    def unregister_model(self, model_id: str, force: bool = False) -> int:
        """Removes the model and releases its pool; refused (FAILED_PRECONDITION) while it has
        open sequences unless force. Returns the sequences force closed."""
        request = pb.UnregisterModelRequest(model_id=model_id, force=force)
        return self._call(self._stub.UnregisterModel, request).closed_sequences

    def open_sequence(self, model_id: str, sequence_id: str, initial_tokens: int = 0,
                      parent: Optional[str] = None, prefix_pages: int = 0):
        request = pb.OpenSequenceRequest(model_id=model_id, sequence_id=sequence_id,
                                         initial_tokens=initial_tokens,
                                         parent_sequence_id=parent or "",
                                         prefix_pages=prefix_pages)
        return self._call(self._stub.OpenSequence, request).sequence

    def append_tokens(self, model_id: str, sequence_id: str, tokens: int) -> int:
        """Grows the sequence; returns its new length in tokens."""
        request = pb.AppendTokensRequest(model_id=model_id, sequence_id=sequence_id,
                                         tokens=tokens)
        return self._call(self._stub.AppendTokens, request).length_tokens

    def close_sequence(self, model_id: str, sequence_id: str) -> int:
        """Closes the sequence; returns the frames it referenced (shared ones return to the
        pool only at their last reference)."""
        request = pb.CloseSequenceRequest(model_id=model_id, sequence_id=sequence_id)
        return self._call(self._stub.CloseSequence, request).live_frames

    def pool_stats(self, model_id: str):
        return self._call(self._stub.GetPoolStats, pb.GetPoolStatsRequest(model_id=model_id))

    def list_sequences(self, model_id: str, block_tables: bool = False):
        request = pb.ListSequencesRequest(model_id=model_id, include_block_tables=block_tables)
        return list(self._call(self._stub.ListSequences, request).sequences)

    # --- decisions ------------------------------------------------------------------------

    @staticmethod
    def _policy(policy: Optional[str], params: dict) -> "types.PolicyParams":
        unknown = set(params) - {"tau", "alpha", "sink_tokens", "protect_tail_page",
                                 "protect_sink_pages", "protect_recent_pages"}
        if unknown:
            raise ValueError(f"policy parameters: unknown {sorted(unknown)}")
        return types.PolicyParams(name=policy or "", **params)

    def decide(self, model_id: str, sequence_id: str, stats: np.ndarray, *,
               layers: Optional[Sequence[int]] = None, pages: Optional[int] = None,
               fraction: Optional[float] = None, token_slots: Optional[int] = None,
               policy: Optional[str] = None, dtype: Optional[str] = None,
               **params) -> list:
        """Decides (and applies) eviction for several layers in one call.

        `stats` is [layers, query_heads, tokens]; `layers` names the layer index of each slice
        (default 0..n-1).
        """
        stats = np.asarray(stats)
        if stats.ndim == 2:
            stats = stats[np.newaxis]
        indices = list(layers) if layers is not None else list(range(stats.shape[0]))
        request = pb.DecideRequest(
            model_id=model_id, sequence_id=sequence_id,
            layers=[pb.LayerStatistic(layer=index, statistic=statistic_message(stats[i], dtype))
                    for i, index in enumerate(indices)],
            budget=_budget(pages, fraction, token_slots), policy=self._policy(policy, params))
        response = self._call(self._stub.Decide, request)
        return [_to_layer_decision(layer) for layer in response.layers]

    def decide_stream(self, model_id: str, sequence_id: str,
                      layer_stats: Iterable, *, pages: Optional[int] = None,
                      fraction: Optional[float] = None, token_slots: Optional[int] = None,
                      policy: Optional[str] = None, dtype: Optional[str] = None,
                      stream_timeout_s: float = 300.0, **params) -> Iterator[LayerDecision]:
        """Streams (layer, [query_heads, tokens]) pairs as prefill produces them and yields
        each layer's decision in order. Not retried."""
        budget = _budget(pages, fraction, token_slots)
        policy_params = self._policy(policy, params)

        def requests():
            for layer, array in layer_stats:
                yield pb.DecideLayerRequest(
                    model_id=model_id, sequence_id=sequence_id,
                    layer=pb.LayerStatistic(layer=layer,
                                            statistic=statistic_message(array, dtype)),
                    budget=budget, policy=policy_params)

        try:
            for decision in self._stub.DecideStream(requests(), timeout=stream_timeout_s,
                                                    metadata=self._metadata):
                yield _to_layer_decision(decision)
        except grpc.RpcError as error:
            raise EntrokvError(error.code().name, error.details() or "") from None
