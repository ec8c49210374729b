"""Python client of entrokvd, the Page-EntroKV cache manager."""

from entrokv.client import (NO_DECISION_CODES, Client, default_policy, default_statistic,
                            key_statistic, mixed_statistic, retry_service_config,
                            statistic_message)
from entrokv.daemon import DaemonAddresses, parse_listening_line
from entrokv.device import DeviceBuffer, device_statistic, map_arena
from entrokv.errors import (AbortedError, AlreadyExistsError, CancelledError, DataLossError,
                            DeadlineExceededError, EntrokvError, FailedPreconditionError,
                            InternalError, InvalidArgumentError, NotFoundError, OutOfRangeError,
                            PermissionDeniedError, ResourceExhaustedError, UnauthenticatedError,
                            UnavailableError, UnimplementedError, UnknownError)
from entrokv.records import (AdmissionHint, Appended, BlockTable, GroupDecision, LayerDecision,
                             ModelGeometry, PoolInfo, PoolStats, PressureInfo, RankArena,
                             SequenceInfo, TenantUsage)

Error = EntrokvError  # a short alias for the base class

__all__ = [
    "Client", "NO_DECISION_CODES", "default_policy", "default_statistic", "key_statistic",
    "mixed_statistic", "retry_service_config",
    "statistic_message",
    "DaemonAddresses", "parse_listening_line", "DeviceBuffer", "device_statistic", "map_arena",
    "EntrokvError", "Error", "AbortedError", "AlreadyExistsError", "CancelledError",
    "DataLossError", "DeadlineExceededError", "FailedPreconditionError", "InternalError",
    "InvalidArgumentError", "NotFoundError", "OutOfRangeError", "PermissionDeniedError",
    "ResourceExhaustedError", "UnauthenticatedError", "UnavailableError", "UnimplementedError",
    "UnknownError",
    "BlockTable", "GroupDecision", "LayerDecision", "ModelGeometry", "PoolInfo", "PoolStats",
    "SequenceInfo", "AdmissionHint", "Appended", "PressureInfo", "TenantUsage", "RankArena",
]
