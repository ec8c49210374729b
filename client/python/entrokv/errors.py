"""Exceptions of the entrokv client: one subclass of EntrokvError per gRPC status code.

Catch the subclass you handle (``except entrokv.NotFoundError``) or the base class for all of
them; ``error.code`` still holds the status name (e.g. "NOT_FOUND") for code written against the
single exception type of earlier versions.
"""

from __future__ import annotations

from typing import Dict, Type

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
    """The pool has no free frames, or the daemon sheds load."""
    status_code = grpc.StatusCode.RESOURCE_EXHAUSTED


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


def from_rpc_error(error: grpc.RpcError) -> EntrokvError:
    return error_for(error.code(), error.details() or "")
