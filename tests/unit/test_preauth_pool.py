"""Sockets before they authenticate, counted per address from their accept
(socket_gateway/preauth.py, PreAuthPool): the caps, and who loses a place when
every place is taken."""

from __future__ import annotations

import itertools
import random

import pytest

from shared.errors import ConfigError
from shared.settings import Settings
from socket_gateway.preauth import PER_KEY_CAP, TOTAL_CAP, PreAuthPool
from socket_gateway.ws.admission import HandshakeLimits

_names = itertools.count()


def _fill(pool: PreAuthPool[str], key: str, n: int) -> list[str]:
    items = [f"{key}#{next(_names)}" for _ in range(n)]
    for item in items:
        assert pool.refusal(key) is None
        assert pool.add(item, key) is None
    return items


def test_one_key_is_capped_and_the_others_still_get_in() -> None:
    pool: PreAuthPool[str] = PreAuthPool(max_total=10, max_per_key=3)
    _fill(pool, "10.0.0.2", 3)
    assert pool.refusal("10.0.0.2") == PER_KEY_CAP
    assert pool.refusal("10.0.0.1") is None
    _fill(pool, "10.0.0.1", 3)
    assert len(pool) == 6 and pool.held("10.0.0.2") == 3


def test_when_full_the_biggest_holder_loses_its_oldest_to_a_smaller_one() -> None:
    pool: PreAuthPool[str] = PreAuthPool(max_total=5, max_per_key=5)
    flood = _fill(pool, "attacker", 4)
    _fill(pool, "office", 1)
    # Full. A newcomer from the biggest holder is refused: it would only take its own place.
    assert pool.refusal("attacker") == TOTAL_CAP
    # One from an address holding fewer takes the place of the biggest holder's oldest.
    assert pool.refusal("client") is None
    assert pool.add("client-a", "client") == (flood[0], "attacker")
    assert flood[0] not in pool and "client-a" in pool
    assert len(pool) == 5 and pool.held("attacker") == 3
    assert pool.add("client-b", "client") == (flood[1], "attacker")
    # Now attacker 2, client 2, office 1: ties go to the key that got there first.
    assert pool.refusal("office") is None
    assert pool.add("office-b", "office") == (flood[2], "attacker")
    # attacker 1, client 2, office 2: both at the top refuse their own newcomers.
    assert pool.refusal("client") == TOTAL_CAP and pool.refusal("office") == TOTAL_CAP
    assert pool.refusal("attacker") is None
    assert pool.add("attacker-z", "attacker") == ("client-a", "client")


def test_authenticated_or_gone_items_free_their_places() -> None:
    pool: PreAuthPool[str] = PreAuthPool(max_total=3, max_per_key=2)
    a = _fill(pool, "a", 2)
    pool.discard(a[0])
    pool.discard(a[0])  # twice (evicted, then its connection_lost): harmless
    pool.discard("never added")
    assert pool.held("a") == 1 and len(pool) == 1
    a += _fill(pool, "a", 1)
    b = _fill(pool, "b", 1)
    assert pool.refusal("a") == PER_KEY_CAP
    for item in a[1:] + b:
        pool.discard(item)
    assert len(pool) == 0 and pool.held("a") == 0
    assert pool.refusal("a") is None


def test_the_biggest_holder_is_tracked_through_any_order_of_operations() -> None:
    rng = random.Random(7)
    pool: PreAuthPool[int] = PreAuthPool(max_total=40, max_per_key=12)
    keys = [f"k{i}" for i in range(8)]
    live: dict[int, str] = {}
    for n in range(5000):
        if live and rng.random() < 0.45:
            item = rng.choice(list(live))
            pool.discard(item)
            del live[item]
        else:
            key = rng.choice(keys)
            held = {k: sum(1 for v in live.values() if v == k) for k in keys}
            top = max(held.values())
            why = pool.refusal(key)
            if held[key] >= 12:
                assert why == PER_KEY_CAP
            elif len(live) >= 40 and held[key] >= top:
                assert why == TOTAL_CAP
            else:
                assert why is None
                evicted = pool.add(n, key)
                if len(live) >= 40:
                    assert evicted is not None
                    victim, holder = evicted
                    assert held[holder] == top and live.pop(victim) == holder
                    # its oldest: no item of that key was added before it
                    assert all(i > victim for i, k in live.items() if k == holder)
                else:
                    assert evicted is None
                live[n] = key
        assert len(pool) == len(live)


def test_bad_caps_are_refused() -> None:
    for args in ((0, 1), (1, 0)):
        with pytest.raises(ValueError, match="at least 1"):
            PreAuthPool(*args)


def test_the_per_address_cap_and_the_request_line_deadline_come_from_settings() -> None:
    s = Settings.load(
        {"IMROUTE_WS_MAX_PRE_AUTH_PER_IP": "16", "IMROUTE_WS_REQUEST_LINE_TIMEOUT_S": "0.5"}
    )
    limits = HandshakeLimits.from_settings(s)
    assert limits.max_pre_auth_per_ip == 16 and limits.request_line_s == 0.5
    defaults = HandshakeLimits.from_settings(Settings.load({}))
    assert defaults.max_pre_auth_per_ip == 256 and defaults.request_line_s == 1.0
    for name, value in (
        ("IMROUTE_WS_MAX_PRE_AUTH_PER_IP", "0"),
        ("IMROUTE_WS_REQUEST_LINE_TIMEOUT_S", "0"),
    ):
        with pytest.raises(ConfigError, match=name):
            Settings.load({name: value})


def test_full_when_every_place_is_taken() -> None:
    pool: PreAuthPool[str] = PreAuthPool(max_total=2, max_per_key=2)
    assert not pool.full
    _fill(pool, "a", 2)
    assert pool.full
    pool.discard(next(iter(pool._key_of)))
    assert not pool.full
