"""A typed wrapper over the generated gRPC stubs: numpy arrays in, dataclasses out.

Statistics are numpy arrays [query_heads, tokens] (one layer) or [layers, query_heads, tokens]:
float32, float16, or bfloat16 stored as uint16 (pass dtype="bf16"). A failed call raises the
EntrokvError subclass of its gRPC status (entrokv.errors), carrying the daemon's message; bad
arguments the client can see itself raise ValueError before anything is sent.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from entrokv.errors import EntrokvError, from_rpc_error
from entrokv.records import (BACKENDS, FRAME_LAYOUTS, NEIGHBOURHOOD_POOLINGS, SELECTION_SCOPES,
                             STATISTIC_KINDS,
                             Appended, LayerDecision, PoolInfo, PoolStats, PressureInfo,
                             SequenceInfo, evictions, frame_assignments)
from entrokv.v1 import cache_manager_pb2 as pb
from entrokv.v1 import cache_manager_pb2_grpc as pb_grpc
from entrokv.v1 import types_pb2 as types

_DTYPES = {
    "f32": (types.DTYPE_FLOAT32, np.float32),
    "f16": (types.DTYPE_FLOAT16, np.float16),
    "bf16": (types.DTYPE_BFLOAT16, np.uint16),
}
_POLICY_PARAMS = ("tau", "alpha", "sink_tokens", "protect_tail_page", "protect_sink_pages",
                  "protect_recent_pages", "neighbourhood_kernel", "neighbourhood_pooling",
                  "group_floor")
_SERVICE = "entrokv.v1.CacheManager"
# Retried by the channel on UNAVAILABLE. DecideStream is not: a stream may have applied layers.
_RETRIED_METHODS = ("RegisterModel", "GetModel", "ListModels", "OpenSequence", "AppendTokens",
                    "Decide", "CloseSequence", "GetPoolStats", "ListSequences",
                    "TruncateSequence", "SwapOutSequence", "ResumeSequence")
# The codes a fail-open decision takes for "no decision": the daemon unreachable, restarting or
# draining; no answer in time; shed or over a bound. Anything else is the caller's error.
NO_DECISION_CODES = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")
_log = logging.getLogger("entrokv")


def retry_service_config(max_attempts: int, initial_backoff_s: float = 0.05) -> str:
    """The channel's service config: retry UNAVAILABLE only, with a backoff doubling from
    initial_backoff_s (gRPC adds +-20% jitter). gRPC caps max_attempts at 5; 1 turns retries
    off."""
    if max_attempts <= 1:
        return json.dumps({})
    # Never reached before the fifth attempt: the backoff doubles as documented.
    max_backoff_s = max(1.0, initial_backoff_s * 8)
    return json.dumps({"methodConfig": [{
        "name": [{"service": _SERVICE, "method": method} for method in _RETRIED_METHODS],
        "retryPolicy": {
            "maxAttempts": max_attempts,
            "initialBackoff": f"{initial_backoff_s:g}s",
            "maxBackoff": f"{max_backoff_s:g}s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }]})


def _reconnect_options(initial_backoff_s: float) -> List[Tuple[str, int]]:
    """The channel reconnects on the retries' schedule. gRPC's own reconnect backoff (1 s,
    growing) would keep the channel failing fast for a second after a daemon restart, so every
    retry of a call made while the daemon was down failed before it was back (the C++ client
    ties its reconnects the same way)."""
    backoff_ms = max(1, int(initial_backoff_s * 1000))
    return [("grpc.initial_reconnect_backoff_ms", backoff_ms),
            ("grpc.min_reconnect_backoff_ms", backoff_ms),
            ("grpc.max_reconnect_backoff_ms", max(backoff_ms * 8, 1000))]


def _choice(field: str, value: str, choices: dict) -> Any:
    if value not in choices:
        raise ValueError(f"{field}: {value!r} is not one of {', '.join(sorted(choices))}")
    return choices[value]


def statistic_message(array: np.ndarray, dtype: Optional[str] = None,
                      kind: Optional[str] = None) -> "types.Statistic":
    """One layer's [query_heads, tokens] array as a Statistic (bytes, no float lists).

    kind: how the worker measured it, "last_row" (default), "window_mean" or "accumulated"
    (docs/architecture.md §3.1); informational to the daemon."""
    array = np.asarray(array)
    if array.ndim != 2:
        raise ValueError(f"statistic: expected [query_heads, tokens], got shape {array.shape}")
    if dtype is None:
        dtype = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}.get(array.dtype)
        if dtype is None:
            raise ValueError(
                f"statistic: dtype {array.dtype} is not float32 or float16; pass dtype='bf16' "
                "for bfloat16 stored as uint16")
    wire_dtype, numpy_dtype = _choice("dtype", dtype, _DTYPES)
    wire_kind = _choice("kind", kind or "last_row", STATISTIC_KINDS)
    data = np.ascontiguousarray(array, dtype=np.dtype(numpy_dtype).newbyteorder("<"))
    return types.Statistic(dtype=wire_dtype, query_heads=array.shape[0], tokens=array.shape[1],
                           kind=wire_kind, data=data.tobytes())


KEY_SCORES = {"keydiff": types.KEY_SCORE_KEYDIFF, "norm": types.KEY_SCORE_NORM,
              "expected_attention": types.KEY_SCORE_EXPECTED_ATTENTION}


def key_statistic(query_heads: int, tokens: int, score: str = "keydiff",
                  dtype: str = "f32", query_mean: Optional[np.ndarray] = None,
                  query_covariance: Optional[np.ndarray] = None,
                  query_covariance_factor: Optional[np.ndarray] = None) -> "types.Statistic":
    """A Statistic with no values: the daemon scores the keys this worker wrote into the
    sequence's frames (query-agnostic; core/scoring/key_scores.h). score: "keydiff" (keys unlike
    the group's mean direction are kept), "norm" (small keys are kept) or "expected_attention"
    (the attention the next queries are expected to pay each key: query_mean [query_heads,
    head_dim], the mean of the queries expected next with RoPE applied as those positions would,
    and optionally query_covariance [query_heads, head_dim, head_dim], or instead a factor F of
    it, query_covariance_factor [query_heads, rank, head_dim] with S = F'F: rank x head_dim per
    token rather than head_dim^2); dtype: the keys' element
    type in the pool ("f32", "f16", "bf16"). query_heads and tokens as for an array (a
    tensor-parallel rank's own heads). Pass it to decide() or decide_stream() in place of an
    array; it works with every pooling policy (mean is the plain choice)."""
    wire_score = _choice("score", score, KEY_SCORES)
    wire_dtype, _ = _choice("dtype", dtype, _DTYPES)
    keys = types.KeyStatistic(score=wire_score)
    if score == "expected_attention":
        if query_mean is None:
            raise ValueError("query_mean: expected_attention needs the queries' mean "
                             "[query_heads, head_dim]")
        mean = np.asarray(query_mean, np.float32)
        if mean.ndim != 2 or mean.shape[0] != query_heads:
            raise ValueError(f"query_mean: shape {mean.shape}, expected [{query_heads}, head_dim]")
        keys.query_mean.extend(mean.ravel().tolist())
        if query_covariance is not None:
            covariance = np.asarray(query_covariance, np.float32)
            if covariance.shape != mean.shape + mean.shape[1:]:
                raise ValueError(f"query_covariance: shape {covariance.shape}, expected "
                                 f"[{query_heads}, {mean.shape[1]}, {mean.shape[1]}]")
            keys.query_covariance.extend(covariance.ravel().tolist())
        if query_covariance_factor is not None:
            if query_covariance is not None:
                raise ValueError("query_covariance_factor: not with query_covariance")
            factor = np.asarray(query_covariance_factor, np.float32)
            if (factor.ndim != 3 or factor.shape[0] != query_heads
                    or factor.shape[2] != mean.shape[1]
                    or not 1 <= factor.shape[1] <= mean.shape[1]):
                raise ValueError(f"query_covariance_factor: shape {factor.shape}, expected "
                                 f"[{query_heads}, rank in [1, {mean.shape[1]}], "
                                 f"{mean.shape[1]}]")
            keys.query_covariance_factor.extend(factor.ravel().tolist())
    elif (query_mean is not None or query_covariance is not None
          or query_covariance_factor is not None):
        raise ValueError(f"query_mean, query_covariance, query_covariance_factor: only for "
                         f"expected_attention, not {score}")
    return types.Statistic(dtype=wire_dtype, query_heads=query_heads, tokens=tokens, keys=keys)


# Statistic.keys_mix.rule by name: how a keys mix combines each token's two scaled scores.
MIX_RULES = {"average": types.KEYS_MIX_RULE_AVERAGE, "max": types.KEYS_MIX_RULE_MAX,
             "cover": types.KEYS_MIX_RULE_COVER}


def mixed_statistic(rows: Any, keys: "types.Statistic", keys_weight: Optional[float] = None,
                    dtype: Optional[str] = None, kind: Optional[str] = None,
                    rule: Optional[str] = None, cover_mass: Optional[float] = None,
                    cover_question_kernel: Optional[int] = None,
                    cover_keys_kernel: Optional[int] = None,
                    cover_question_forward: Optional[bool] = None,
                    cover_rank_sinks: Optional[bool] = None) -> "types.Statistic":
    """Values sent and the daemon's scores of the keys in the frames, mixed: the daemon scales
    each head's two rows to sum to their shares, keys_weight (in (0, 1); None: 0.5) on the keys',
    and combines them by `rule` (a MIX_RULES name: "average", their sum, as None; "max", each
    token's larger score, the union of what either row favours) (Statistic.keys_mix).
    rule="cover" orders pages instead, per KV group: the pages the rows rank highest until they
    hold cover_mass (in (0, 1]; None: 0.5) of the rows' mass past the sink pages and before the
    protected tail, then the others as the keys rank them, each ranking max-pooled over its
    kernel (cover_question_kernel, cover_keys_kernel; None: 7 and 3; the keys head by head
    before the group's mean, as a policy's neighbourhood pools them), the rows' centred or,
    with cover_question_forward, forward (each token over itself and the kernel - 1 before it,
    so what follows a token the question attends to ranks with it); with cover_rank_sinks, the
    sink pages rank among the rows' pages too, the sink tokens' mass left out of the share; no
    keys_weight, and the policy must pool no tokens itself (no neighbourhood_kernel, not
    snapkv).
    rows: an array [query_heads, tokens] (dtype and kind as in statistic_message) or a Statistic with values (shared memory, a device buffer); keys: a
    key_statistic() of the same heads and tokens. E.g. the question's rows with the keys'
    expected attention. A host pool only; not with accumulate."""
    if not isinstance(keys, types.Statistic) or keys.WhichOneof("source") != "keys":
        raise ValueError("keys: a key_statistic() message")
    if isinstance(rows, types.Statistic):
        if rows.WhichOneof("source") in (None, "keys"):
            raise ValueError("rows: a statistic with values (data, shared_memory, device_buffer)")
        message = types.Statistic()
        message.CopyFrom(rows)
    else:
        message = statistic_message(np.asarray(rows), dtype, kind)
    if (message.query_heads, message.tokens) != (keys.query_heads, keys.tokens):
        raise ValueError(f"keys: {keys.query_heads} heads x {keys.tokens} tokens, the rows have "
                         f"{message.query_heads} x {message.tokens}")
    if keys_weight is not None and not 0.0 < keys_weight < 1.0:
        raise ValueError(f"keys_weight: must be in (0, 1), got {keys_weight}")
    if rule is not None and rule not in MIX_RULES:
        raise ValueError(f"rule: one of {', '.join(MIX_RULES)}, got {rule!r}")
    cover = {"cover_mass": cover_mass, "cover_question_kernel": cover_question_kernel,
             "cover_keys_kernel": cover_keys_kernel,
             "cover_question_forward": cover_question_forward,
             "cover_rank_sinks": cover_rank_sinks}
    if rule == "cover" and keys_weight is not None:
        raise ValueError('keys_weight: not with rule="cover" (it orders pages, it adds no scores)')
    for name, value in cover.items():
        if value is not None and rule != "cover":
            raise ValueError(f'{name}: only with rule="cover"')
    if cover_mass is not None and not 0.0 < cover_mass <= 1.0:
        raise ValueError(f"cover_mass: must be in (0, 1], got {cover_mass}")
    message.keys_mix.keys.CopyFrom(keys.keys)
    message.keys_mix.keys_dtype = keys.dtype
    if keys_weight is not None:
        message.keys_mix.keys_weight = keys_weight
    if rule is not None:
        message.keys_mix.rule = MIX_RULES[rule]
    for name, value in cover.items():
        if value is not None:
            setattr(message.keys_mix, name, value)  # the daemon checks the kernels
    return message


# The default policy, chosen on the development prompts (docs/evaluation/README.md): the heads'
# rows averaged (mean), pages spread over the layers by the pyramid allocator; its statistic is
# default_statistic(). Before the question is known each row is also max-pooled over 3
# neighbouring tokens; with the question, the statistic's cover rule orders the pages itself and
# must not be pooled again. decide(..., **default_policy(with_question)).
_DEFAULT_POLICY = {"policy": "mean", "allocator": "pyramid"}


def default_policy(with_question: bool) -> Dict[str, Any]:
    """The default policy's decide() arguments for default_statistic()'s statistic:
    with_question when its question_rows were given."""
    if with_question:
        return dict(_DEFAULT_POLICY)
    return {**_DEFAULT_POLICY, "neighbourhood_kernel": 3, "neighbourhood_pooling": "max"}


def default_statistic(query_heads: int, tokens: int, query_mean: np.ndarray,
                      query_covariance: np.ndarray, question_rows: Any = None,
                      dtype: str = "f32") -> "types.Statistic":
    """The default policy's statistic: the expected attention of the next queries (query_mean
    [query_heads, head_dim] and query_covariance [query_heads, head_dim, head_dim], RoPE applied
    as the next positions would; key_statistic()), alone when the worker decides before the
    question is known. With the question's rows [query_heads, tokens] (question_rows), the
    cover rule orders each group's pages (mixed_statistic(rule="cover")): the pages the
    question's rows rank highest, pooled forward over 7 tokens (cover_question_forward) so that
    what follows a token the question attends to ranks with it, the sink pages among them
    (cover_rank_sinks: a needle beside the sinks is kept for the question), until they hold half
    its mass past the sink tokens, then expected attention's (the daemon's defaults for the share
    and the widths).
    dtype: the keys' element type in the pool. Decide with default_policy(question_rows is not
    None)."""
    keys = key_statistic(query_heads, tokens, score="expected_attention", dtype=dtype,
                         query_mean=query_mean, query_covariance=query_covariance)
    if question_rows is None:
        return keys
    return mixed_statistic(question_rows, keys, kind="window_mean", rule="cover",
                           cover_question_forward=True, cover_rank_sinks=True)


def _budget(pages: Optional[int], fraction: Optional[float],
            token_slots: Optional[int], auto_floor: Optional[float] = None,
            allocator: Optional[str] = None,
            layer_floor: Optional[float] = None) -> "types.Budget":
    given = [value is not None for value in (pages, fraction, token_slots, auto_floor)]
    if sum(given) != 1:
        raise ValueError("budget: give exactly one of pages, fraction, token_slots, auto_floor")
    if allocator is not None and fraction is None and token_slots is None:
        raise ValueError("allocator: only with fraction or token_slots (it spreads them over "
                         "the layers)")
    if layer_floor is not None and allocator is None:
        raise ValueError('layer_floor: only with allocator="mass"')
    if pages is not None:
        return types.Budget(pages_per_group=pages)
    if auto_floor is not None:
        return types.Budget(auto_budget=types.AutoBudget(floor_fraction=auto_floor))
    if fraction is not None:
        budget = types.Budget(fraction=fraction)
    else:
        budget = types.Budget(token_slots=token_slots)
    if allocator is not None:
        budget.allocator = allocator  # the daemon checks the name (budget.allocator)
    if layer_floor is not None:
        budget.layer_floor = layer_floor  # the daemon checks it (budget.layer_floor)
    return budget


def _policy(policy: Optional[str], params: dict,
            scope: Optional[str] = None) -> "types.PolicyParams":
    unknown = set(params) - set(_POLICY_PARAMS)
    if unknown:
        raise ValueError(f"policy parameters: unknown {sorted(unknown)}; known: "
                         f"{', '.join(_POLICY_PARAMS)}")
    # None leaves the scope to the daemon: layer for a layer-layout pool, group otherwise.
    wire_scope = (types.SELECTION_SCOPE_UNSPECIFIED if scope is None
                  else _choice("scope", scope, SELECTION_SCOPES))
    params = dict(params)
    if params.get("neighbourhood_pooling") is not None:  # "max" or "mean"
        params["neighbourhood_pooling"] = _choice(
            "neighbourhood_pooling", params["neighbourhood_pooling"], NEIGHBOURHOOD_POOLINGS)
    return types.PolicyParams(name=policy or "", scope=wire_scope, **params)


def _layer_statistic(item: Any, dtype: Optional[str], kind: Optional[str] = None,
                     accumulate: bool = False) -> "pb.LayerStatistic":
    try:
        layer, array = item
    except (TypeError, ValueError):
        raise ValueError("layer_stats: each item must be a (layer, [query_heads, tokens] array) "
                         f"pair, got {type(item).__name__}") from None
    if not isinstance(layer, (int, np.integer)) or isinstance(layer, bool):
        raise ValueError(f"layer_stats: layer index must be an int, got {layer!r}")
    if accumulate and kind != "accumulated":
        raise ValueError("accumulate: a chunk is added to a running sum of column sums; pass "
                         "kind='accumulated'")
    if isinstance(array, types.Statistic):  # built already: a device buffer (entrokv.device)
        statistic = types.Statistic()
        statistic.CopyFrom(array)
        if kind is not None:
            statistic.kind = _choice("kind", kind, STATISTIC_KINDS)
        return pb.LayerStatistic(layer=int(layer), statistic=statistic, accumulate=accumulate)
    return pb.LayerStatistic(layer=int(layer), statistic=statistic_message(array, dtype, kind),
                             accumulate=accumulate)


class Client:
    """A connection to entrokvd. Unary calls retry on UNAVAILABLE only (the channel's
    retryPolicy, up to max_attempts tries in all, gRPC allowing 5 at most, the backoff doubling
    from initial_backoff_s): a daemon restarting within the backoffs' sum (0.35 s at the
    defaults) carries the call across. DecideStream is not retried. timeout_s bounds each call,
    retries included.

    Fail-open decisions (try_decide, try_decide_stream) give "no decision" (None) instead of
    raising when the daemon cannot answer within decision_timeout_s (NO_DECISION_CODES),
    counted in no_decisions and logged as a WARNING on the "entrokv" logger. wait_for_ready:
    every other call waits for the channel to (re)connect within timeout_s instead of failing
    at once while the daemon is down: for a worker whose frames the daemon hands out, which
    has to wait for its appends while a restart runs."""

    def __init__(self, target: str = "127.0.0.1:50051", timeout_s: float = 10.0,
                 token: Optional[str] = None, max_attempts: int = 4,
                 max_message_bytes: int = 256 << 20, initial_backoff_s: float = 0.05,
                 decision_timeout_s: float = 0.5, wait_for_ready: bool = False):
        if initial_backoff_s <= 0:
            raise ValueError(f"initial_backoff_s: {initial_backoff_s} is not > 0")
        if decision_timeout_s <= 0:
            raise ValueError(f"decision_timeout_s: {decision_timeout_s} is not > 0")
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes),
                   ("grpc.enable_retries", 1 if max_attempts > 1 else 0),
                   ("grpc.service_config",
                    retry_service_config(max_attempts, initial_backoff_s))]
        options += _reconnect_options(initial_backoff_s)
        self._channel = grpc.insecure_channel(target, options=options)
        self._stub = pb_grpc.CacheManagerStub(self._channel)
        # Fail-open decisions go on a channel of their own without retries: one attempt, as a
        # decision late is a decision lost, and the reason it failed is the one reported.
        self._target = target
        self._decision_options = [option for option in options
                                  if option[0] not in ("grpc.enable_retries",
                                                       "grpc.service_config")]
        self._decision_options.append(("grpc.enable_retries", 0))
        self._decision_channel: Optional[grpc.Channel] = None
        self._timeout_s = timeout_s
        self._metadata = [("authorization", f"Bearer {token}")] if token else None
        self._decision_timeout_s = decision_timeout_s
        self._wait_for_ready = wait_for_ready
        self._no_decisions = {code: 0 for code in NO_DECISION_CODES}
        self._no_decisions_lock = threading.Lock()

    def close(self) -> None:
        self._channel.close()
        if self._decision_channel is not None:
            self._decision_channel.close()

    def _decision_stub(self) -> "pb_grpc.CacheManagerStub":
        with self._no_decisions_lock:
            if self._decision_channel is None:
                self._decision_channel = grpc.insecure_channel(self._target,
                                                               options=self._decision_options)
                self._decision_stub_instance = pb_grpc.CacheManagerStub(self._decision_channel)
            return self._decision_stub_instance

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request):
        try:
            return method(request, timeout=self._timeout_s, metadata=self._metadata,
                          wait_for_ready=self._wait_for_ready)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    @property
    def no_decisions(self) -> Dict[str, int]:
        """Decisions the fail-open calls went without so far, by status code name."""
        with self._no_decisions_lock:
            return dict(self._no_decisions)

    def _no_decision(self, error: EntrokvError, model_id: str, sequence_id: str) -> bool:
        """Counts and logs `error` when it means "no decision"; False for the caller's own
        errors."""
        if error.code not in NO_DECISION_CODES:
            return False
        with self._no_decisions_lock:
            self._no_decisions[error.code] += 1
        _log.warning("entrokv: no decision for %s/%s, the cache stays as it is: %s", model_id,
                     sequence_id, error)
        return True

    # --- models and sequences -------------------------------------------------------------

    def register_model(self, model_id: str, *, layers: int, query_heads: int, kv_groups: int,
                       head_dim: int, page_size: int = 16, element_bytes: int = 2,
                       capacity_bytes: int = 0, frame_layout: str = "group",
                       backend: str = "host", tensor_parallel_size: int = 1,
                       devices: Optional[Sequence[int]] = None) -> PoolInfo:
        """Creates the model's pool. frame_layout: "group" or "layer"; backend: "host" or
        "cuda". `devices`: the device of each of the `tensor_parallel_size` ranks' arenas
        (default: rank r on device r). In the "layer" layout the ranks share every frame and
        decide together; in "group" each rank's frames (PoolInfo.ranks[r].first_frame, .frames)
        are its own and each rank decides its groups alone."""
        geometry = types.ModelGeometry(layers=layers, query_heads=query_heads,
                                       kv_groups=kv_groups, head_dim=head_dim,
                                       page_size=page_size, element_bytes=element_bytes)
        request = pb.RegisterModelRequest(
            model_id=model_id, geometry=geometry, capacity_bytes=capacity_bytes,
            frame_layout=_choice("frame_layout", frame_layout, FRAME_LAYOUTS),
            backend=_choice("backend", backend, BACKENDS),
            tensor_parallel_size=tensor_parallel_size, devices=list(devices or []))
        return PoolInfo.from_message(self._call(self._stub.RegisterModel, request).pool)

    def get_model(self, model_id: str) -> PoolInfo:
        response = self._call(self._stub.GetModel, pb.GetModelRequest(model_id=model_id))
        return PoolInfo.from_message(response.pool)

    def list_models(self) -> List[PoolInfo]:
        """Every registered model's pool, ordered by model id."""
        response = self._call(self._stub.ListModels, pb.ListModelsRequest())
        return [PoolInfo.from_message(pool) for pool in response.pools]

    def unregister_model(self, model_id: str, force: bool = False) -> int:
        """Removes the model and releases its pool; refused (FAILED_PRECONDITION) while it has
        open sequences unless force. Returns the sequences force closed."""
        request = pb.UnregisterModelRequest(model_id=model_id, force=force)
        return self._call(self._stub.UnregisterModel, request).closed_sequences

    def open_sequence(self, model_id: str, sequence_id: str, initial_tokens: int = 0,
                      parent: Optional[str] = None, prefix_pages: int = 0, *,
                      tenant: str = "", priority: int = 0,
                      auto_floor: Optional[float] = None) -> SequenceInfo:
        """Opens a sequence. Pool pressure: `tenant` (one of the daemon's --tenant_share names,
        "" the default), `priority` in [0, 9] and, with `auto_floor`, a budget the daemon
        chooses that never goes below that share of the sequence. A pool that cannot admit it
        raises ResourceExhaustedError whose `admission` says how many frames are missing and
        when to retry."""
        return self.open_sequence_frames(model_id, sequence_id, initial_tokens, parent,
                                         prefix_pages, tenant=tenant, priority=priority,
                                         auto_floor=auto_floor)[0]

    def open_sequence_frames(self, model_id: str, sequence_id: str, initial_tokens: int = 0,
                             parent: Optional[str] = None, prefix_pages: int = 0, *,
                             tenant: str = "", priority: int = 0,
                             auto_floor: Optional[float] = None
                             ) -> Tuple[SequenceInfo, np.ndarray, PressureInfo]:
        """As open_sequence, and the entries allocated for the initial tokens (int32 rows
        layer, group, page, frame) and the pool's pressure."""
        request = pb.OpenSequenceRequest(model_id=model_id, sequence_id=sequence_id,
                                         initial_tokens=initial_tokens,
                                         parent_sequence_id=parent or "",
                                         prefix_pages=prefix_pages, tenant=tenant,
                                         priority=priority)
        if auto_floor is not None:
            request.auto_budget.floor_fraction = auto_floor
        response = self._call(self._stub.OpenSequence, request)
        return (SequenceInfo.from_message(response.sequence),
                frame_assignments(response.new_frames),
                PressureInfo.from_message(response.pressure))

    def append_tokens(self, model_id: str, sequence_id: str, tokens: int) -> int:
        """Grows the sequence; returns its new length in tokens."""
        request = pb.AppendTokensRequest(model_id=model_id, sequence_id=sequence_id,
                                         tokens=tokens)
        return self._call(self._stub.AppendTokens, request).length_tokens

    def append_tokens_frames(self, model_id: str, sequence_id: str,
                             tokens: int) -> Tuple[int, np.ndarray]:
        """As append_tokens, and the entries that became live: int32 rows (layer, group, page,
        frame), shape [n, 4]. A worker writes the new tokens' K/V there (a copy-on-write page of
        a fork, or a page that was evicted, gets a new frame)."""
        request = pb.AppendTokensRequest(model_id=model_id, sequence_id=sequence_id,
                                         tokens=tokens)
        response = self._call(self._stub.AppendTokens, request)
        return response.length_tokens, frame_assignments(response.new_frames)

    def append(self, model_id: str, sequence_id: str, tokens: int) -> Appended:
        """As append_tokens_frames, and what pool pressure did: the pages a quota took from the
        sequence before its new frames were allocated, and the pool's pressure."""
        request = pb.AppendTokensRequest(model_id=model_id, sequence_id=sequence_id,
                                         tokens=tokens)
        response = self._call(self._stub.AppendTokens, request)
        return Appended(length_tokens=response.length_tokens,
                        new_frames=frame_assignments(response.new_frames),
                        evicted=evictions(response.evicted),
                        pressure=PressureInfo.from_message(response.pressure))

    def swap_out(self, model_id: str, sequence_id: str) -> Tuple[int, int]:
        """Copies the sequence's frames to the daemon's host memory and frees them; returns
        (frames freed, bytes swapped). The sequence stays open until resume or close."""
        request = pb.SwapOutSequenceRequest(model_id=model_id, sequence_id=sequence_id)
        response = self._call(self._stub.SwapOutSequence, request)
        return response.freed_frames, response.swapped_bytes

    def resume(self, model_id: str, sequence_id: str
               ) -> Tuple[SequenceInfo, np.ndarray, PressureInfo]:
        """Copies a swapped-out sequence back into new frames; returns it, every live entry of
        its new block tables (int32 rows layer, group, page, frame) and the pool's pressure. An
        admission: ResourceExhaustedError (with `admission`) when the frames are not there."""
        request = pb.ResumeSequenceRequest(model_id=model_id, sequence_id=sequence_id)
        response = self._call(self._stub.ResumeSequence, request)
        return (SequenceInfo.from_message(response.sequence),
                frame_assignments(response.new_frames),
                PressureInfo.from_message(response.pressure))

    def truncate_sequence(self, model_id: str, sequence_id: str,
                          tokens: int) -> Tuple[int, int]:
        """Drops the last `tokens` tokens (speculative tokens the target model rejected).
        Returns (the new length in tokens, frames returned to the free list). Pages past the
        new end are released, evicted pages stay evicted, the page that becomes the tail keeps
        its frame (a fork's shared tail is copied at the next append). OUT_OF_RANGE for more
        tokens than the sequence holds."""
        request = pb.TruncateSequenceRequest(model_id=model_id, sequence_id=sequence_id,
                                             tokens=tokens)
        response = self._call(self._stub.TruncateSequence, request)
        return response.length_tokens, response.frames_freed

    def close_sequence(self, model_id: str, sequence_id: str) -> int:
        """Closes the sequence; returns the frames it referenced (shared ones return to the
        pool only at their last reference)."""
        request = pb.CloseSequenceRequest(model_id=model_id, sequence_id=sequence_id)
        return self._call(self._stub.CloseSequence, request).live_frames

    def pool_stats(self, model_id: str) -> PoolStats:
        request = pb.GetPoolStatsRequest(model_id=model_id)
        return PoolStats.from_message(self._call(self._stub.GetPoolStats, request))

    def iter_sequences(self, model_id: str, block_tables: bool = False,
                       page_size: int = 0) -> Iterator[SequenceInfo]:
        """Every open sequence of the model in id order, fetched one ListSequences page at a
        time (page_size sequences per call; 0: the daemon's default) as the iterator advances.
        A sequence open throughout is yielded exactly once; one opened or closed meanwhile may
        or may not be."""
        request = pb.ListSequencesRequest(model_id=model_id, include_block_tables=block_tables,
                                          page_size=page_size)
        while True:
            response = self._call(self._stub.ListSequences, request)
            for sequence in response.sequences:
                yield SequenceInfo.from_message(sequence)
            if not response.next_page_token:
                return
            request.page_token = response.next_page_token

    def list_sequences(self, model_id: str, block_tables: bool = False) -> List[SequenceInfo]:
        """Every open sequence of the model, ordered by id (all pages)."""
        return list(self.iter_sequences(model_id, block_tables))

    # --- decisions ------------------------------------------------------------------------

    def decide(self, model_id: str, sequence_id: str, stats: np.ndarray, *,
               layers: Optional[Sequence[int]] = None, pages: Optional[int] = None,
               fraction: Optional[float] = None, token_slots: Optional[int] = None,
               policy: Optional[str] = None, dtype: Optional[str] = None,
               scope: Optional[str] = None, kind: Optional[str] = None,
               accumulate: bool = False, use_cached_weights: bool = False,
               degrade_on_deadline: bool = False, answer_within_ms: int = 0,
               auto_floor: Optional[float] = None, rank: int = 0,
               allocator: Optional[str] = None, layer_floor: Optional[float] = None,
               **params) -> List[LayerDecision]:
        """Decides (and applies) eviction for several layers in one call.

        `stats` is [layers, query_heads, tokens]; `layers` names the layer index of each slice
        (default 0..n-1). `scope`: "group" (one page set per layer and group), "layer" (one per
        layer, shared by every group) or None (the daemon's: layer for a layer-layout pool).
        `kind`: the statistics' StatisticKind, as in statistic_message. `auto_floor` instead of
        a budget: the daemon's quota decides (pool pressure), never below that floor (not with
        `accumulate` or `degrade_on_deadline`). `allocator`: how a fraction or token_slots
        budget is spread over the layers, "uniform" (the daemon's default), "pyramid"
        (linearly more pages in lower layers) or "mass" (the layers of this call share the
        uniform plan's pages, each next page to the layer where it keeps the most of its
        groups' score mass, every layer at least `layer_floor` of the mean, default 0.5; not
        on decide_stream).
        Lifecycle (docs/integrating.md): `accumulate` adds each layer's statistic, one prefill
        chunk's column sums (kind "accumulated"), to the running sum the daemon keeps and decides
        on that; `use_cached_weights` pools the heads with the weights of the layer's previous
        decision (decode time); `degrade_on_deadline` lets layers that cannot be scored within
        the call's deadline, or `answer_within_ms`, be decided by position, flagged `degraded`.
        Tensor parallelism: `rank` is this worker's rank; `stats` holds its own query heads
        ([layers, query_heads / t, tokens]). In the "layer" layout the call returns when every
        rank's has come, with the decision all ranks share; in "group" it decides this rank's
        groups alone, at once (docs/service.md, "Several GPUs and tensor parallelism").
        `params`: the PolicyParams fields (tau, alpha, ..., neighbourhood_kernel, group_floor:
        the share of its quota each group keeps while the rest moves to the layer's best pages,
        docs/service.md, "Group quotas that move").
        """
        request = self._decide_request(model_id, sequence_id, stats, layers, pages, fraction,
                                       token_slots, policy, dtype, scope, kind, accumulate,
                                       use_cached_weights, degrade_on_deadline,
                                       answer_within_ms, auto_floor, params, rank=rank,
                                       allocator=allocator, layer_floor=layer_floor)
        response = self._call(self._stub.Decide, request)
        return [LayerDecision.from_message(layer) for layer in response.layers]

    def try_decide(self, model_id: str, sequence_id: str, stats: np.ndarray,
                   **kwargs) -> Optional[List[LayerDecision]]:
        """Fail-open decide: the same arguments, but None ("no decision": keep the cache as it
        is) when the daemon cannot answer within decision_timeout_s (NO_DECISION_CODES; one
        attempt, on a channel of its own that is never retried and reconnects by itself).
        Counted in no_decisions and logged. Other errors are raised as decide raises
        them. A decision given up on may still have been applied just after: a worker whose
        cache the daemon owns rereads its block tables before it relies on them."""
        request = self._decide_request(model_id, sequence_id, stats, **kwargs)
        try:
            response = self._decision_stub().Decide(request, timeout=self._decision_timeout_s,
                                                    metadata=self._metadata)
        except grpc.RpcError as rpc_error:
            error = from_rpc_error(rpc_error)
            if self._no_decision(error, model_id, sequence_id):
                return None
            raise error from None
        return [LayerDecision.from_message(layer) for layer in response.layers]

    def _decide_request(self, model_id: str, sequence_id: str, stats: np.ndarray,
                        layers: Optional[Sequence[int]] = None, pages: Optional[int] = None,
                        fraction: Optional[float] = None, token_slots: Optional[int] = None,
                        policy: Optional[str] = None, dtype: Optional[str] = None,
                        scope: Optional[str] = None, kind: Optional[str] = None,
                        accumulate: bool = False, use_cached_weights: bool = False,
                        degrade_on_deadline: bool = False, answer_within_ms: int = 0,
                        auto_floor: Optional[float] = None, params: Optional[dict] = None,
                        rank: int = 0, allocator: Optional[str] = None,
                        layer_floor: Optional[float] = None,
                        **more_params) -> "pb.DecideRequest":
        params = dict(params or {}, **more_params)
        if isinstance(stats, types.Statistic):
            stats = [stats]
        if (isinstance(stats, (list, tuple)) and stats
                and any(isinstance(item, types.Statistic) for item in stats)):
            # Statistic messages (entrokv.device.device_statistic), or arrays among them.
            stats = list(stats)
        else:
            stats = np.asarray(stats)
            if stats.ndim == 2:
                stats = stats[np.newaxis]
        indices = list(layers) if layers is not None else list(range(len(stats)))
        if len(indices) != len(stats):
            raise ValueError(f"layers: {len(indices)} indices for {len(stats)} statistics")
        return pb.DecideRequest(
            model_id=model_id, sequence_id=sequence_id,
            layers=[_layer_statistic((index, stats[i]), dtype, kind, accumulate)
                    for i, index in enumerate(indices)],
            budget=_budget(pages, fraction, token_slots, auto_floor, allocator, layer_floor),
            policy=_policy(policy, params, scope), use_cached_weights=use_cached_weights,
            degrade_on_deadline=degrade_on_deadline, answer_within_ms=answer_within_ms,
            rank=rank)

    def decide_stream(self, model_id: str, sequence_id: str,
                      layer_stats: Iterable[Tuple[int, np.ndarray]], *,
                      pages: Optional[int] = None, fraction: Optional[float] = None,
                      token_slots: Optional[int] = None, policy: Optional[str] = None,
                      dtype: Optional[str] = None, scope: Optional[str] = None,
                      kind: Optional[str] = None, stream_timeout_s: float = 300.0,
                      accumulate: bool = False, use_cached_weights: bool = False,
                      degrade_on_deadline: bool = False, answer_within_ms: int = 0,
                      auto_floor: Optional[float] = None, rank: Optional[int] = None,
                      allocator: Optional[str] = None, **params) -> Iterator[LayerDecision]:
        """Streams (layer, [query_heads, tokens]) pairs as prefill produces them and yields
        each layer's decision in order. Not retried. `kind`: the statistics' StatisticKind, as
        in statistic_message; `accumulate`, `use_cached_weights`, `degrade_on_deadline`,
        `auto_floor`, `allocator` and `answer_within_ms` as in decide (answer_within_ms counts from the
        daemon reading each layer).

        Tensor parallelism: with `rank` set, each rank streams its own query heads' rows
        ([query_heads / t, tokens] per layer) on a stream of its own; a layer's decision comes
        when every rank's message for it has (docs/service.md, "Several GPUs and tensor
        parallelism"). Unset: every layer carries the whole model's rows.

        Arguments are checked before the stream opens: the budget and policy always, and every
        layer when `layer_stats` is a list or tuple (a bad one raises ValueError and nothing is
        sent). A generator is read lazily, so that layers go out as prefill makes them: a bad
        item, or an exception the generator raises, ends the stream after the layers before it
        were decided and is re-raised here as itself.
        """
        requests, failure = self._stream_requests(
            model_id, sequence_id, layer_stats, pages, fraction, token_slots, policy, dtype,
            scope, kind, accumulate, use_cached_weights, degrade_on_deadline, answer_within_ms,
            auto_floor, params, rank=rank, allocator=allocator)
        try:
            for decision in self._stub.DecideStream(requests, timeout=stream_timeout_s,
                                                    metadata=self._metadata):
                yield LayerDecision.from_message(decision)
        except grpc.RpcError as error:
            if failure:
                raise failure[0] from None
            raise from_rpc_error(error) from None
        if failure:
            raise failure[0]

    def try_decide_stream(self, model_id: str, sequence_id: str,
                          layer_stats: Iterable[Tuple[int, np.ndarray]], *,
                          stream_timeout_s: float = 300.0,
                          **kwargs) -> Optional[List[LayerDecision]]:
        """Fail-open decide_stream: the same arguments; returns every layer's decision, or None
        ("no decision") when the stream fails with one of NO_DECISION_CODES or the decisions
        are not all in within decision_timeout_s of the last layer handed over (the stream is
        cancelled then). Counted in no_decisions and logged; other errors are raised.

        None does not mean nothing changed: layers decided before the stream broke are applied.
        A worker whose cache the daemon owns rereads its block tables before it relies on them
        (the pool-backed worker does, once the daemon answers again)."""
        call: List[Any] = []
        timer: List[threading.Timer] = []
        late = threading.Event()

        def cancel_late() -> None:
            late.set()
            if call:
                call[0].cancel()

        requests, failure = self._stream_requests(model_id, sequence_id, layer_stats, **kwargs)

        def then_wait() -> Iterator["pb.DecideLayerRequest"]:
            yield from requests
            # Everything is sent: the decisions owe no more than decision_timeout_s from here.
            timer.append(threading.Timer(self._decision_timeout_s, cancel_late))
            timer[0].daemon = True
            timer[0].start()

        decisions: List[LayerDecision] = []
        try:
            stream = self._decision_stub().DecideStream(then_wait(), timeout=stream_timeout_s,
                                                        metadata=self._metadata)
            call.append(stream)
            if late.is_set():  # the timer fired before the call was here to cancel
                stream.cancel()
            for decision in stream:
                decisions.append(LayerDecision.from_message(decision))
        except grpc.RpcError as rpc_error:
            if failure:
                raise failure[0] from None
            error = from_rpc_error(rpc_error)
            if late.is_set() and error.code == "CANCELLED":
                error = EntrokvError("DEADLINE_EXCEEDED",
                                     f"no decision within {self._decision_timeout_s} s of the "
                                     "last layer")
            if self._no_decision(error, model_id, sequence_id):
                return None
            raise error from None
        finally:
            if timer:
                timer[0].cancel()
        if failure:
            raise failure[0]
        return decisions

    def _stream_requests(self, model_id: str, sequence_id: str,
                         layer_stats: Iterable[Tuple[int, np.ndarray]],
                         pages: Optional[int] = None, fraction: Optional[float] = None,
                         token_slots: Optional[int] = None, policy: Optional[str] = None,
                         dtype: Optional[str] = None, scope: Optional[str] = None,
                         kind: Optional[str] = None, accumulate: bool = False,
                         use_cached_weights: bool = False, degrade_on_deadline: bool = False,
                         answer_within_ms: int = 0, auto_floor: Optional[float] = None,
                         params: Optional[dict] = None, rank: Optional[int] = None,
                         allocator: Optional[str] = None,
                         **more_params) -> Tuple[Iterable, List[BaseException]]:
        """The stream's requests (encoded at once for a list or tuple, lazily for a generator)
        and the list that receives what a lazy generator raised."""
        budget = _budget(pages, fraction, token_slots, auto_floor, allocator)
        policy_params = _policy(policy, dict(params or {}, **more_params), scope)
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ValueError(f"rank: must be an int >= 0, got {rank!r}")

        def request(layer: "pb.LayerStatistic") -> "pb.DecideLayerRequest":
            message = pb.DecideLayerRequest(model_id=model_id, sequence_id=sequence_id,
                                            layer=layer, budget=budget, policy=policy_params,
                                            use_cached_weights=use_cached_weights,
                                            degrade_on_deadline=degrade_on_deadline,
                                            answer_within_ms=answer_within_ms)
            if rank is not None:
                message.rank = rank
            return message

        failure: List[BaseException] = []
        if isinstance(layer_stats, (list, tuple)):
            encoded = [request(_layer_statistic(item, dtype, kind, accumulate))
                       for item in layer_stats]
            return iter(encoded), failure

        def lazily() -> Iterator["pb.DecideLayerRequest"]:
            # gRPC reads this on its own thread and reports anything raised here only as
            # UNKNOWN "Exception iterating requests!": keep the exception, end the stream.
            try:
                for item in layer_stats:
                    yield request(_layer_statistic(item, dtype, kind, accumulate))
            except Exception as error:  # noqa: BLE001 -- re-raised in the caller's thread
                failure.append(error)

        return lazily(), failure


__all__ = ["Client", "EntrokvError", "NO_DECISION_CODES", "statistic_message", "mixed_statistic",
           "retry_service_config"]
