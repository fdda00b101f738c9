from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot as redis_key_slot

from router.fleet.codec import decode_gateway, encode_gateway
from router.routes.registry import decode_route, encode_route
from shared.errors import InvalidInput
from shared.keys import (
    SLOTS,
    KeySchema,
    braced,
    key_slot,
    name_hash,
    slot_tag,
    slot_tagged,
    validate_id,
)
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


def test_a_gateway_record_says_its_bus_and_one_of_the_version_before_reads_without() -> None:
    info = GatewayInfo("gw1", "g1", "ws://h:1/ws", "h:2", 5, 99, bus="pubsub")
    assert decode_gateway(encode_gateway(info)) == info
    before = json.loads(encode_gateway(info))
    del before["bus"]
    read = decode_gateway(json.dumps(before))
    assert read is not None and read.bus == ""  # not said: nothing to compare


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
        return len({redis_key_slot(key.encode()) for key in keys}) == 1

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
    assert redis_key_slot(k.user_inbox("bob{corp}").encode()) == redis_key_slot(
        k.user_inbox(hexed).encode()
    )


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def _keys_apart(k: KeySchema, a: str, b: str) -> None:
    """a's keys are not b's, nor b's SHA-1 hex's, nor any pair's set aside."""
    assert a != b
    for other in (b, _sha1(b)):
        if other != a:
            assert not set(k.user_keys(a)) & set(k.user_keys(other)), (a, other)
    for hexed in (_sha1(a), _sha1(b), a, b):
        assert not set(k.user_keys(a)) & set(k.quarantined_user_keys(hexed)), (a, hexed)


# The shapes that matter: braces alone and in pairs, a uid that is another's SHA-1 hex
# (the old tag), one that spells another's new tag, with and without the prefix.
_X_HEX = _sha1("x}")
TRICKY = [
    "x}",
    _X_HEX + "}:x",
    "{" + _X_HEX + "}:x}",
    "{}",
    "}{",
    "{",
    "}",
    "{{}}",
    "bob{corp}",
    _sha1("bob{corp}"),
    _sha1("bob{corp}") + "}",
    "{" + _sha1("bob{corp}") + "}",
    "{" + _sha1("bob{corp}") + "}:bob{corp}",
    _sha1("bob{corp}") + "}#quarantine",
    "{" + _sha1("bob{corp}") + "}#quarantine",
    "#quarantine",
    ":bob{corp}",
    "imroute:",
    "imroute:useq:{x}",
    "useq:{x}",
]


@pytest.mark.parametrize("prefix", ["imroute:", ""])
def test_no_two_tricky_uids_share_a_key(prefix: str) -> None:
    k = KeySchema(prefix)
    for a in TRICKY:
        for b in TRICKY:
            if a != b:
                _keys_apart(k, a, b)


# Text weighted toward what a key name is made of: braces, ":", "#" and hex digits.
_NAMES = st.text(
    st.one_of(
        st.sampled_from("{}:#"),
        st.sampled_from("0123456789abcdef"),
        st.characters(exclude_categories=("Cs",)),  # no uid holds a lone surrogate
    ),
    min_size=1,
    max_size=12,
)


@st.composite
def _pairs(draw: st.DrawFn) -> tuple[str, str]:
    """Two uids; the second often built from the first's SHA-1 hex, as an attacker would."""
    a = draw(_NAMES)
    hexed = _sha1(a)
    b = draw(
        st.one_of(
            _NAMES,
            st.just(hexed),
            _NAMES.map(lambda tail: hexed + tail),
            _NAMES.map(lambda tail: "{" + hexed + tail),
            _NAMES.map(lambda head: head + hexed + "}"),
        )
    )
    return a, b


@given(_pairs(), st.sampled_from(["imroute:", ""]))
def test_no_two_uids_share_a_key(pair: tuple[str, str], prefix: str) -> None:
    a, b = pair
    if a != b:
        _keys_apart(KeySchema(prefix), a, b)


def test_the_brace_test_and_the_hash_are_the_tags() -> None:
    k = KeySchema("p:")
    assert [braced(u) for u in ("a", "{", "}", "a{b}")] == [False, True, True, True]
    assert name_hash("bob{corp}") == "71c9a76fb93a5cc98216e44101a2ad16c9e56fc4"
    assert k.user_keys("bob{corp}") == (
        k.user_seq("bob{corp}"),
        k.user_log("bob{corp}"),
        k.user_inbox("bob{corp}"),
    )
    aside = k.quarantined_user_keys(name_hash("bob{corp}"))
    assert aside[0] == "p:useq:{71c9a76fb93a5cc98216e44101a2ad16c9e56fc4}#quarantine"
    # In the slot of the keys it was: the migration renames within one slot.
    old = k.legacy_user_keys("bob{corp}")
    assert old is not None
    assert len({redis_key_slot(key.encode()) for key in (*aside, *old)}) == 1


@pytest.mark.parametrize("uid", ["{", "}", "a{b", "a}b", "{x}", "}{", "bob{corp}", "{{}}"])
def test_a_braced_uids_keys_share_one_slot(uid: str) -> None:
    k = KeySchema("imroute:")
    slots = {
        redis_key_slot(key.encode())
        for key in (k.user_seq(uid), k.user_log(uid), k.user_inbox(uid))
    }
    assert len(slots) == 1


@given(st.text(max_size=40))
def test_key_slot_is_redis_clusters(key: str) -> None:
    assert key_slot(key) == redis_key_slot(key.encode())


def test_every_slot_has_a_tag_of_three_letters_or_digits() -> None:
    tags = [slot_tag(slot) for slot in range(SLOTS)]
    assert len(set(tags)) == SLOTS
    assert all(len(t) == 3 and t.isalnum() and t.isascii() for t in tags)
    assert all(redis_key_slot(("{" + t + "}x").encode()) == s for s, t in enumerate(tags))


@given(st.text(min_size=1, max_size=30))
def test_a_slot_tagged_receipt_is_in_its_first_recipients_slot(uid: str) -> None:
    keys = KeySchema("t:")
    push_id = "0123456789abcdef" * 2 + "." + keys.user_slot_tag(uid)
    assert slot_tagged(push_id)
    slot = redis_key_slot(keys.user_seq(uid).encode())
    assert {redis_key_slot(k.encode()) for k in keys.receipt(push_id)} == {slot}


@pytest.mark.parametrize(
    "push_id",
    [
        "0123456789abcdef" * 2,
        "0123456789abcdef" * 2 + ".",
        "0123456789ABCDEF" * 2 + ".abc",
        "0123456789abcdef" * 2 + ".ab-",
        "0123456789abcdef" * 2 + ".abcd",
        "x.abc",
    ],
)
def test_other_push_ids_are_not_slot_tagged(push_id: str) -> None:
    assert not slot_tagged(push_id)
    assert KeySchema().receipt(push_id)[0] == "imroute:rcpt:{" + push_id + "}"
