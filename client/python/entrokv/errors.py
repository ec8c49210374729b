"""Exceptions of the entrokv client: one subclass of EntrokvError per gRPC status code.

Catch the subclass you handle (``except entrokv.NotFoundError``) or the base class for all of
them; ``error.code`` still holds the status name (e.g. "NOT_FOUND") for code written against the
single exception type of earlier versions.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

import grpc


class EntrokvError(Exception):
    """A call failed; `code` is the gRPC status name, `message` the daemon's text."""

    status_code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class CancelledError(EntrokvError):
    status_code = grpc.StatusCode.CANCELLED


class UnknownError(EntrokvError):
    status_code = grpc.StatusCode.UNKNOWN


class InvalidArgumentError(EntrokvError):
    """A request field is out of range or malformed; the message names the field."""
    status_code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(EntrokvError):
    status_code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFoundError(EntrokvError):
    """The model or sequence does not exist."""
    status_code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(EntrokvError):
    status_code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(EntrokvError):
    status_code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(EntrokvError):
    """The pool has no free frames, or the daemon sheds load. `admission` is the daemon's
    AdmissionHint when the pool refused an admission (how many frames are missing, when to
    retry, which sequences it asked to preempt), else None."""
    status_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    admission = None


class FailedPreconditionError(EntrokvError):
    """The request does not fit the sequence's state (e.g. a statistic of the wrong length)."""
    status_code = grpc.StatusCode.FAILED_PRECONDITION


class AbortedError(EntrokvError):
    status_code = grpc.StatusCode.ABORTED


class OutOfRangeError(EntrokvError):
    status_code = grpc.StatusCode.OUT_OF_RANGE


class UnimplementedError(EntrokvError):
    status_code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(EntrokvError):
    status_code = grpc.StatusCode.INTERNAL


class UnavailableError(EntrokvError):
    """The daemon cannot be reached or is shutting down (after the channel's retries)."""
    status_code = grpc.StatusCode.UNAVAILABLE


class DataLossError(EntrokvError):
    status_code = grpc.StatusCode.DATA_LOSS


class UnauthenticatedError(EntrokvError):
    """The daemon wants a bearer token (Client(token=...)) and got none or a wrong one."""
    status_code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: Dict[grpc.StatusCode, Type[EntrokvError]] = {
    cls.status_code: cls
    for cls in (CancelledError, UnknownError, InvalidArgumentError, DeadlineExceededError,
                NotFoundError, AlreadyExistsError, PermissionDeniedError, ResourceExhaustedError,
                FailedPreconditionError, AbortedError, OutOfRangeError, UnimplementedError,
                InternalError, UnavailableError, DataLossError, UnauthenticatedError)
}


def error_for(code: grpc.StatusCode, message: str) -> EntrokvError:
    """The EntrokvError subclass for `code` (EntrokvError itself for an unexpected code)."""
    return _BY_CODE.get(code, EntrokvError)(code.name, message)


_DETAILS_KEY = "grpc-status-details-bin"
_ADMISSION_TYPE = "type.googleapis.com/entrokv.v1.AdmissionHint"


def _admission_hint(error: grpc.RpcError) -> Optional[object]:
    """The AdmissionHint in the call's status details (entrokv.v1.StatusDetails), if any."""
    from entrokv.records import AdmissionHint  # noqa: PLC0415 -- records imports the stubs
    from entrokv.v1 import types_pb2 as types  # noqa: PLC0415
    trailing = getattr(error, "trailing_metadata", None)
    for key, value in (trailing() or ()) if callable(trailing) else ():
        if key != _DETAILS_KEY:
            continue
        details = types.StatusDetails()
        try:
            details.ParseFromString(value)
        except Exception:  # noqa: BLE001 -- details that do not parse are left out
            return None
        for any_message in details.details:
            if any_message.type_url == _ADMISSION_TYPE:
                hint = types.AdmissionHint()
                hint.ParseFromString(any_message.value)
                return AdmissionHint.from_message(hint)
    return None


def from_rpc_error(error: grpc.RpcError) -> EntrokvError:
    converted = error_for(error.code(), error.details() or "")
    if isinstance(converted, ResourceExhaustedError):
        converted.admission = _admission_hint(error)
    return converted
