"""The one error tree of imroute; library errors are mapped into it where they are caught.

    ImrouteError
    ├── ConfigError                a setting has a bad value; names the setting
    ├── InvalidInput               a caller's or client's input is malformed; names the field
    │   ├── InvalidUid             ... a uid that breaks the uid rule (shared.uids)
    │   └── PayloadTooLarge        ... because it is over its limit
    ├── AuthError                  an API key or client token is missing, invalid or expired
    ├── RegistryUnavailable        Redis (routes, fleet, jobs, drains) did not answer
    │   └── RegistryRefused        ... or answered an error that another try gets again
    ├── TooManyConnections         a user is at IMROUTE_MAX_CONNECTIONS_PER_USER live routes
    ├── GatewayUnavailable         a gateway could not be reached or failed a call
    │   └── NoEligibleGateway      no gateway can take a client or a call now
    ├── BusUnavailable             the message bus did not answer or refused a call
    └── DirectoryUnavailable       the user directory's database failed

The push service maps them to HTTP answers (`push_service`), the gateway to WebSocket
close codes; library errors are translated at the module that calls the library: redis-py in
`router.redis.errors`, grpc in `router.gateway_rpc.client`, google-api-core in
`router.bus.pubsub_errors`, SQLAlchemy in `router.directory.sql`.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "BusUnavailable",
    "ConfigError",
    "DirectoryUnavailable",
    "GatewayUnavailable",
    "ImrouteError",
    "InvalidInput",
    "InvalidUid",
    "NoEligibleGateway",
    "PayloadTooLarge",
    "RegistryRefused",
    "RegistryUnavailable",
    "TooManyConnections",
]


class ImrouteError(Exception):
    """Base of every error imroute raises on purpose."""


class ConfigError(ImrouteError):
    """A setting has a bad value; the message names the setting."""


class InvalidInput(ImrouteError):
    """Input from a caller or client is malformed; `field` names what."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class InvalidUid(InvalidInput):
    """A uid breaks the one uid rule (`shared.uids`); the message never quotes it."""


class PayloadTooLarge(InvalidInput):
    """Input is larger than the limit for `field`."""


class AuthError(ImrouteError):
    """A credential (API key or client token) is missing, invalid or expired."""


class RegistryUnavailable(ImrouteError):
    """Redis, holding the routes and the fleet, did not answer. `maybe_applied`: what was
    written to it may have run all the same (its reply timed out, or the connection broke
    after the write), so "nothing was sent" cannot be said."""

    maybe_applied: bool = False


class RegistryRefused(RegistryUnavailable):
    """Redis answered with an error reply that another try would get again (a key of the
    wrong type, a script's error, OOM): not an outage to wait out."""


class TooManyConnections(ImrouteError):
    """A new connection was refused: its user already has `limit` live routes, fleet-wide."""

    def __init__(self, uid: str, limit: int) -> None:
        super().__init__(f"user {uid!r} is at the per-user connection cap ({limit})")
        self.uid = uid
        self.limit = limit


class GatewayUnavailable(ImrouteError):
    """A gateway could not be reached or failed a call."""

    def __init__(self, gateway_id: str, reason: str, code: str | None = None) -> None:
        super().__init__(f"gateway {gateway_id}: {reason}")
        self.gateway_id = gateway_id
        self.reason = reason
        self.code = code  # the gRPC status code's name, when a call failed with one


class NoEligibleGateway(GatewayUnavailable):
    """No gateway could take the call (none eligible, or every one's circuit open)."""

    def __init__(self, reason: str = "no eligible gateway") -> None:
        super().__init__("*", reason)


class BusUnavailable(ImrouteError):
    """The message bus did not answer or refused a call."""


class DirectoryUnavailable(ImrouteError):
    """The user directory's database did not answer or failed a statement."""
