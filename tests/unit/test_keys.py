from __future__ import annotations

import pytest

from router.fleet.codec import decode_gateway, encode_gateway
from router.routes.codec import decode_route, encode_route
from shared.errors import InvalidInput
from shared.keys import KeySchema, validate_id
from shared.models import GatewayInfo


def test_route_round_trip() -> None:
    value = encode_route("gw1", "g1", "10.0.0.7", 9101, 1234)
    route = decode_route("alice", "gw1.ab.1", value)
    assert route is not None
    assert (route.gateway_id, route.group_id, route.ip, route.port) == (
        "gw1",
        "g1",
        "10.0.0.7",
        9101,
    )
    assert route.expires_ms == 1234
    assert route.grpc_address == "10.0.0.7:9101"


def test_ipv6_route_address() -> None:
    route = decode_route("u", "c", encode_route("gw1", "g1", "::1", 9101, 1))
    assert route is not None and route.grpc_address == "[::1]:9101"


@pytest.mark.parametrize("value", ["", "a|b", "gw|g|ip|notaport|1", "gw|g|ip|1|x|y"])
def test_unreadable_route_values_are_skipped(value: str) -> None:
    assert decode_route("u", "c", value) is None


def test_gateway_round_trip() -> None:
    info = GatewayInfo("gw1", "g1", "ws://h:1/ws", "h:2", 5, 99)
    assert decode_gateway(encode_gateway(info)) == info
    assert decode_gateway("{") is None


def test_keys_are_prefixed() -> None:
    keys = KeySchema("p:")
    assert keys.route("alice") == "p:route:alice"
    assert keys.gateway("gw1") == "p:gw:gw1"
    assert keys.gateways() == "p:gateways"


def test_ids_cannot_break_the_route_format() -> None:
    assert validate_id("gateway_id", "gw-1.a") == "gw-1.a"
    with pytest.raises(InvalidInput, match="gateway_id"):
        validate_id("gateway_id", "gw|1")
