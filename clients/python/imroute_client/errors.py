"""The client's exceptions, in one tree:

ClientError              anything the client raises on purpose
 ├── Unauthorized        dispatch or the gateway's handshake answered 401: the token
 │                       is bad or expired; never retried
 ├── DispatchRefused     dispatch answered a 4xx no retry fixes (a wrong api_url, ...)
 └── ProtocolError       a frame the client cannot read (logged and skipped by the
                         iterator, raised only by `parse_frame`)
"""

from __future__ import annotations

__all__ = ["ClientError", "DispatchRefused", "ProtocolError", "Unauthorized"]


class ClientError(Exception):
    """Base of every error the client raises."""


class Unauthorized(ClientError):
    """The token was refused (HTTP 401); the client stops for good."""


class DispatchRefused(ClientError):
    """Dispatch answered a client error that retrying cannot fix."""


class ProtocolError(ClientError):
    """A server frame that is not what the protocol says."""
