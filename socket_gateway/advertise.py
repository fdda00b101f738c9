"""The addresses a gateway announces: its WebSocket URL's host and its gRPC address.

A gateway bound to a wildcard (`0.0.0.0`, `::`) listens on every interface, but others
must be told one address. `gethostbyname(gethostname())`, the usual guess, is loopback on
most Debian and Ubuntu hosts (`127.0.1.1 <hostname>` in /etc/hosts), which announced
`ws://127.0.0.1` and a loopback gRPC address to the fleet without a word. So:

- `IMROUTE_ADVERTISE_HOST` (`--advertise-host`) wins; a loopback one while a port listens
  beyond loopback is a warning (a one-host test may want it; a fleet never does);
- a port bound to one address announces that address;
- a port bound to a wildcard announces this host's one non-loopback, non-link-local
  address (for `::`, its one IPv4 address if it has one, as a dual-stack socket takes
  IPv4 too); where there are several, the one the host name resolves to among them;
  else the start is refused (exit 2), naming the flag and the candidates.

`choose` decides from the addresses it is given; `host_addresses` reads them.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ConfigError
from shared.internal_auth import is_loopback

__all__ = ["Advertised", "HostAddresses", "advertised", "choose", "host_addresses"]

log = logging.getLogger(__name__)

WILDCARDS = frozenset({"0.0.0.0", "::", "", "[::]"})
FLAG = "--advertise-host (IMROUTE_ADVERTISE_HOST)"


@dataclass(frozen=True, slots=True)
class HostAddresses:
    """This host's addresses: its interfaces' and those its name resolves to."""

    interfaces: tuple[str, ...]
    by_name: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Advertised:
    ws_host: str
    grpc_host: str


def _usable(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", maxsplit=1)[0])
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)


def choose(bind: str, addresses: HostAddresses) -> str:
    """The address to announce for a port bound to the wildcard `bind`; ConfigError
    when this host has none, or several and its name does not pick one."""
    ipv4_only = bind in ("0.0.0.0", "")
    usable = [a for a in dict.fromkeys(addresses.interfaces) if _usable(a)]
    v4 = [a for a in usable if ":" not in a]
    candidates = v4 if ipv4_only or v4 else usable
    if len(candidates) == 1:
        return candidates[0]
    named = [a for a in dict.fromkeys(addresses.by_name) if a in candidates]
    if len(named) == 1:
        return named[0]
    if not candidates:
        raise ConfigError(
            f"{FLAG}: required, as this gateway listens on {bind or '0.0.0.0'} and this "
            "host has no address beyond loopback to announce to the push service and "
            "clients"
        )
    raise ConfigError(
        f"{FLAG}: required, as this gateway listens on {bind or '0.0.0.0'} and this host "
        f"has several addresses ({', '.join(candidates)}): say which one the push "
        "service and clients reach it at"
    )


def advertised(
    ws_bind: str,
    grpc_bind: str,
    advertise_host: str | None,
    ws_public_url: str | None,
    addresses: HostAddresses | None = None,
) -> Advertised:
    """The hosts to announce for each port (see the module's docstring); `addresses`
    are read from the host only when a wildcard bind needs them."""
    if advertise_host:
        listens_beyond = not is_loopback(grpc_bind) or (
            ws_public_url is None and not is_loopback(ws_bind)
        )
        if is_loopback(advertise_host) and listens_beyond:
            log.warning(
                "IMROUTE_ADVERTISE_HOST is %s, a loopback address, while this gateway "
                "listens beyond loopback (ws %s, grpc %s): a push service or client on "
                "another host cannot reach it there",
                advertise_host,
                ws_bind,
                grpc_bind,
            )
        return Advertised(advertise_host, advertise_host)
    hosts = []
    for bind in (ws_bind, grpc_bind):
        if bind in WILDCARDS:
            addresses = addresses or host_addresses()
            hosts.append(choose(bind, addresses))
        else:
            hosts.append(bind.strip("[]"))
    return Advertised(hosts[0], hosts[1])


# Linux's ioctl asking an interface's IPv4 address (linux/sockios.h).
SIOCGIFADDR = 0x8915
IF_INET6 = Path("/proc/net/if_inet6")


def host_addresses() -> HostAddresses:
    """This host's interface addresses (IPv4 by ioctl, IPv6 from /proc, Linux) and what
    its host name resolves to."""
    return HostAddresses(tuple(_ipv4_interfaces()) + tuple(_ipv6_interfaces()), _by_name())


def _ipv4_interfaces() -> Iterable[str]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on it
                continue
            yield socket.inet_ntoa(reply[20:24])


def _ipv6_interfaces() -> Sequence[str]:
    try:
        lines = IF_INET6.read_text().splitlines()
    except OSError:
        return ()
    found = []
    for line in lines:
        fields = line.split()
        if fields:
            found.append(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    return found


def _by_name() -> tuple[str, ...]:
    with contextlib.suppress(OSError):
        infos = socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)
        return tuple(str(info[4][0]) for info in infos)
    return ()
