"""The one mapping of google-api-core's errors into ours, for every Pub/Sub call."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc.aio
from google.api_core import exceptions as gexc
from google.api_core.retry import if_exception_type

from shared.errors import BusUnavailable

__all__ = ["RETRYABLE_CODES", "is_retryable_code", "pubsub_errors"]

# The codes Google's clients retry a Publish on.
RETRYABLE_CODES = if_exception_type(
    gexc.Cancelled,
    gexc.ServiceUnavailable,
    gexc.DeadlineExceeded,
    gexc.InternalServerError,
    gexc.Aborted,
    gexc.ResourceExhausted,
    gexc.Unknown,
)


def is_retryable_code(exc: BaseException) -> bool:
    """Whether Google's clients would retry a Publish that failed with `exc`."""
    return isinstance(exc, Exception) and RETRYABLE_CODES(exc)


@contextmanager
def pubsub_errors(what: str) -> Iterator[None]:
    """Map google-api-core errors into BusUnavailable, naming the operation."""
    try:
        yield
    except gexc.RetryError as exc:
        raise BusUnavailable(f"pubsub {what}: gave up retrying: {exc.cause}") from exc
    except grpc.aio.UsageError as exc:  # e.g. a call on a channel close() closed
        raise BusUnavailable(f"pubsub {what}: {exc}") from exc
    except gexc.GoogleAPICallError as exc:
        raise BusUnavailable(f"pubsub {what}: {exc.code} {exc.message}") from exc
