from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

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


def test_keys_used_together_share_a_cluster_slot() -> None:
    """Each MULTI and each script names keys of one Redis Cluster slot (CRC16 of the
    hash tag, as the cluster computes it)."""
    k = KeySchema("imroute:")

    def one_slot(*keys: str) -> bool:
        return len({key_slot(key.encode()) for key in keys}) == 1

    # A job's MULTI and scripts: its hash, the running set, the recent list.
    assert one_slot(k.job("p1"), k.job("p2"), k.jobs_running(), k.jobs_recent())
    assert one_slot(*(k.stats(b) for b in range(0, 600_000, 2000)))
    assert one_slot(*k.receipt("p1"))
    assert one_slot(k.user_seq("u{1}"), k.user_log("u{1}"), k.user_inbox("u{1}"))
    assert one_slot(k.topic_seq("broadcast"), k.topic_log("broadcast"))
    assert one_slot(
        k.webhook_events(),
        k.webhook_overflow(),
        k.offline_due(),
        k.presence_gateways(),
        k.presence_prefix() + "alice",
        k.gateway_users("gw1"),
    )
    assert one_slot(k.drain("gw1"), k.drain("gw2"))


def test_a_brace_free_uid_keeps_its_key_names() -> None:
    k = KeySchema("p:")
    assert (k.user_seq("alice"), k.user_log("alice"), k.user_inbox("alice")) == (
        "p:useq:{alice}",
        "p:ulog:{alice}",
        "p:uinbox:{alice}",
    )
    assert k.legacy_user_keys("alice") is None


def test_a_braced_uid_is_named_in_full_after_its_sha1_tag() -> None:
    k = KeySchema("p:")
    hexed = "71c9a76fb93a5cc98216e44101a2ad16c9e56fc4"  # SHA-1 of "bob{corp}"
    assert k.user_inbox("bob{corp}") == "p:uinbox:{" + hexed + "}:bob{corp}"
    assert k.legacy_user_keys("bob{corp}") == (
        f"p:useq:{{{hexed}}}",
        f"p:ulog:{{{hexed}}}",
        f"p:uinbox:{{{hexed}}}",
    )
    # The old names were the hex user's own; the new ones are nobody else's, and stay
    # in the old slot (the migration moves keys within one slot).
    assert k.legacy_user_keys("bob{corp}")[2] == k.user_inbox(hexed)  # type: ignore[index]
    assert k.user_inbox("bob{corp}") != k.user_inbox(hexed)
    assert key_slot(k.user_inbox("bob{corp}").encode()) == key_slot(k.user_inbox(hexed).encode())


@given(st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12))
def test_no_two_uids_share_a_key(a: str, b: str) -> None:
    k = KeySchema("imroute:")
    # b, and the uid a braced a was tagged by before
    for other in (b, hashlib.sha1(a.encode()).hexdigest()):
        if other != a:
            assert k.user_seq(a) != k.user_seq(other)
            assert k.user_log(a) != k.user_log(other)
            assert k.user_inbox(a) != k.user_inbox(other)


@pytest.mark.parametrize("uid", ["{", "}", "a{b", "a}b", "{x}", "}{", "bob{corp}", "{{}}"])
def test_a_braced_uids_keys_share_one_slot(uid: str) -> None:
    k = KeySchema("imroute:")
    slots = {
        key_slot(key.encode()) for key in (k.user_seq(uid), k.user_log(uid), k.user_inbox(uid))
    }
    assert len(slots) == 1
