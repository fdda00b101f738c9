"""The one error tree of imroute; library errors are mapped into it where they are caught."""

from __future__ import annotations

__all__ = [
    "AuthError",
    "BusUnavailable",
    "ConfigError",
    "DirectoryUnavailable",
    "GatewayUnavailable",
    "ImrouteError",
    "InvalidInput",
    "PayloadTooLarge",
    "RegistryUnavailable",
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


class PayloadTooLarge(InvalidInput):
    """Input is larger than the limit for `field`."""


class AuthError(ImrouteError):
    """A credential (API key or client token) is missing, invalid or expired."""


class RegistryUnavailable(ImrouteError):
    """Redis, holding the routes and the fleet, did not answer."""


class GatewayUnavailable(ImrouteError):
    """A gateway could not be reached or failed a call."""

    def __init__(self, gateway_id: str, reason: str, code: str | None = None) -> None:
        super().__init__(f"gateway {gateway_id}: {reason}")
        self.gateway_id = gateway_id
        self.reason = reason
        self.code = code  # the gRPC status code's name, when a call failed with one


class BusUnavailable(ImrouteError):
    """The message bus did not answer or refused a call."""


class DirectoryUnavailable(ImrouteError):
    """The user directory's database did not answer or failed a statement."""
