"""The credentials of internal calls: the push service's gRPC calls to the gateways.

Two kinds, each enough on its own, both allowed at once:
- a shared token, `IMROUTE_INTERNAL_TOKEN`, sent as `authorization: Bearer <token>` call
  metadata and compared in constant time by the gateway;
- mutual TLS, `IMROUTE_GRPC_TLS_CERT`, `_KEY` and `_CA`: each side shows the cert and
  checks the other's against the CA (the gateway as server, the push service as client).

A gateway listening on a non-loopback gRPC address refuses to start with neither.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ConfigError
from shared.settings import InternalCallSettings

__all__ = [
    "METADATA_KEY",
    "TlsFiles",
    "is_loopback",
    "load_tls",
    "token_matches",
    "token_metadata",
]

METADATA_KEY = "authorization"
_SCHEME = "Bearer "


def token_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries `token`."""
    return ((METADATA_KEY, _SCHEME + token),)


def token_matches(expected: bytes, metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
    """Whether `metadata` carries the token `expected` (its UTF-8 bytes), in constant time."""
    for key, value in metadata or ():
        if key != METADATA_KEY:
            continue
        got = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
        if not got.startswith(_SCHEME.encode()):
            return False
        return hmac.compare_digest(got[len(_SCHEME) :], expected)
    return False


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM bytes of this side's cert chain and key, and of the CA that signs the peers'.
    `server_name`: the name the push service expects in the gateways' certs, when it is
    not the address it dials (pod IPs change; one cert names the service)."""

    cert: bytes
    key: bytes
    ca: bytes
    server_name: str | None = None

    def __repr__(self) -> str:  # never the key
        return f"TlsFiles(server_name={self.server_name!r})"


def load_tls(settings: InternalCallSettings) -> TlsFiles | None:
    """The mTLS files the settings name, read now; None when mTLS is off. Raises
    ConfigError naming the variable of a file that cannot be read or is not PEM."""
    if settings.grpc_tls_cert is None:
        return None
    assert settings.grpc_tls_key is not None and settings.grpc_tls_ca is not None
    return TlsFiles(
        _read("IMROUTE_GRPC_TLS_CERT", settings.grpc_tls_cert, b"CERTIFICATE"),
        _read("IMROUTE_GRPC_TLS_KEY", settings.grpc_tls_key, b"PRIVATE KEY"),
        _read("IMROUTE_GRPC_TLS_CA", settings.grpc_tls_ca, b"CERTIFICATE"),
        settings.grpc_tls_server_name,
    )


def _read(name: str, path: str, kind: bytes) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data or kind not in data:
        raise ConfigError(f"{name}: {path} is not a PEM file holding a {kind.decode().lower()}")
    return data


def is_loopback(host: str) -> bool:
    """Whether `host` (an address to bind) is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name, "0.0.0.0" is not even that: treat as reachable
