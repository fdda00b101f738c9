"""Which host a gateway announces for each port (socket_gateway.advertise), from the
addresses it is given: no network, no host look-ups."""

from __future__ import annotations

import logging

import pytest

from shared.errors import ConfigError
from socket_gateway.advertise import Advertised, HostAddresses, advertised, choose

ONE = HostAddresses(("127.0.0.1", "10.1.2.3", "::1", "fe80::1"), ("127.0.1.1",))
DOCKER = HostAddresses(("127.0.0.1", "10.1.2.3", "172.17.0.1"), ("10.1.2.3",))
TWO = HostAddresses(("127.0.0.1", "10.1.2.3", "172.17.0.1"), ("127.0.1.1",))
LOOPBACK = HostAddresses(("127.0.0.1", "::1", "fe80::1"), ("127.0.0.1",))


def test_a_wildcard_bind_announces_the_hosts_one_address_not_its_loopback_name() -> None:
    assert choose("0.0.0.0", ONE) == "10.1.2.3"
    assert advertised("0.0.0.0", "0.0.0.0", None, None, ONE) == Advertised("10.1.2.3", "10.1.2.3")


def test_several_addresses_are_settled_by_the_host_name_else_refused_naming_the_flag() -> None:
    assert choose("0.0.0.0", DOCKER) == "10.1.2.3"
    with pytest.raises(ConfigError, match="--advertise-host") as info:
        choose("0.0.0.0", TWO)
    assert "IMROUTE_ADVERTISE_HOST" in str(info.value)
    assert "10.1.2.3, 172.17.0.1" in str(info.value)


def test_no_address_beyond_loopback_is_refused() -> None:
    with pytest.raises(ConfigError, match="no address beyond loopback"):
        advertised("0.0.0.0", "0.0.0.0", None, None, LOOPBACK)


def test_ipv6_wildcard_prefers_the_one_ipv4_address_else_the_one_ipv6() -> None:
    both = HostAddresses(("10.1.2.3", "fd00::2", "fe80::1"), ())
    assert choose("::", both) == "10.1.2.3"
    assert choose("::", HostAddresses(("fd00::2", "fe80::1", "::1"), ())) == "fd00::2"
    # an IPv4 bind never announces an IPv6 address
    with pytest.raises(ConfigError):
        choose("0.0.0.0", HostAddresses(("fd00::2",), ()))


def test_each_port_announces_its_own_bind_when_it_is_one_address() -> None:
    # the WebSocket port open to clients, gRPC on loopback: each announces its own
    assert advertised("0.0.0.0", "127.0.0.1", None, None, ONE) == Advertised(
        "10.1.2.3", "127.0.0.1"
    )
    assert advertised("10.9.9.9", "[::1]", None, None) == Advertised("10.9.9.9", "::1")


def test_an_advertise_host_wins_and_a_loopback_one_for_an_open_port_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    assert advertised("127.0.0.1", "127.0.0.1", "127.0.0.1", None) == Advertised(
        "127.0.0.1", "127.0.0.1"
    )
    assert not caplog.records  # a one-host setup: nothing to say
    assert advertised("0.0.0.0", "0.0.0.0", "gw1.internal", None) == Advertised(
        "gw1.internal", "gw1.internal"
    )
    assert not caplog.records
    assert advertised("0.0.0.0", "0.0.0.0", "127.0.0.1", None) == Advertised(
        "127.0.0.1", "127.0.0.1"
    )
    (record,) = caplog.records
    assert "IMROUTE_ADVERTISE_HOST is 127.0.0.1, a loopback address" in record.getMessage()
