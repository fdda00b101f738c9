"""The multicast look-up's decoder: route values -> online uids per group, no Redis."""

from __future__ import annotations

import pytest

from router.routes.registry import decode_route, encode_route, group_live_routes

NOW = 1_000_000


def value(group: str, expires_ms: int, gateway: str = "gw1") -> str:
    return encode_route(gateway, group, "10.0.0.1", 9001, expires_ms)


def test_uids_are_grouped_in_input_order() -> None:
    uids = ["a", "b", "c", "d"]
    values = [[value("g1", NOW + 1)], [value("g2", NOW + 1)], [], [value("g1", NOW + 5)]]
    assert group_live_routes(uids, values, NOW) == (3, {"g1": ["a", "d"], "g2": ["b"]})


def test_a_route_past_its_deadline_does_not_count() -> None:
    values = [[value("g1", NOW)], [value("g1", NOW - 1)], [value("g1", NOW + 1)]]
    assert group_live_routes(["a", "b", "c"], values, NOW) == (1, {"g1": ["c"]})


def test_several_devices_count_once_per_group_and_once_online() -> None:
    values = [
        [
            value("g1", NOW + 1, "gw1"),
            value("g1", NOW + 1, "gw2"),  # a second device in the same group
            value("g2", NOW + 1, "gw3"),
            value("g3", NOW - 1, "gw4"),  # expired
        ]
    ]
    assert group_live_routes(["alice"], values, NOW) == (1, {"g1": ["alice"], "g2": ["alice"]})


def test_a_user_whose_devices_all_expired_is_offline() -> None:
    values = [[value("g1", NOW - 1), value("g2", NOW - 2)]]
    assert group_live_routes(["alice"], values, NOW) == (0, {})


@pytest.mark.parametrize(
    "bad", ["", "a|b", "gw|g|ip|notaport|9999999", "gw|g|ip|1|x|9999999", "gw|g|ip|1|soon"]
)
def test_unreadable_values_count_as_no_route_like_decode_route(bad: str) -> None:
    assert decode_route("u", "c", bad) is None
    # Twice: the second time the unreadable head comes from the per-call cache.
    assert group_live_routes(["a", "b"], [[bad], [bad]], 0) == (0, {})
    assert group_live_routes(["a"], [[bad, value("g1", NOW + 1)]], NOW) == (1, {"g1": ["a"]})


def test_many_gateways_of_one_group_share_its_list() -> None:
    uids = [f"u{i}" for i in range(100)]
    values = [[value(f"g{i % 2}", NOW + 1, gateway=f"gw{i % 10}")] for i in range(100)]
    online, by_group = group_live_routes(uids, values, NOW)
    assert online == 100
    assert by_group == {"g0": uids[0::2], "g1": uids[1::2]}


def test_uids_and_values_must_pair_up() -> None:
    with pytest.raises(ValueError, match="zip"):
        group_live_routes(["a", "b"], [[value("g1", NOW + 1)]], NOW)
