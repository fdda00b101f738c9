"""Who may open a socket (socket_gateway/ws/admission.py): the per-IP connect rate, its
keys, and the counted, rate-limited refusal log."""

from __future__ import annotations

import logging

import pytest

from socket_gateway.preauth import client_key
from socket_gateway.ws.admission import (
    REFUSALS,
    ConnectRate,
    HandshakeLimits,
    Refusals,
    request_line_ok,
)


def test_a_burst_then_the_rate_per_key() -> None:
    rate = ConnectRate(rate_per_s=2, burst=3)
    assert [rate.take("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.take("a", 0.0) == pytest.approx(0.5)  # one token every 0.5 s
    assert rate.take("b", 0.0) == 0.0  # another address has its own bucket
    assert rate.take("a", 0.5) == 0.0
    assert rate.take("a", 0.5) == pytest.approx(0.5)
    # Refused attempts take nothing: waiting the time it said is enough.
    assert rate.take("a", 1.0) == 0.0
    # A long silence refills up to the burst, no more.
    assert [rate.take("a", 100.0) for _ in range(4)][-1] > 0


def test_1500_connects_a_second_pass_a_bucket_sized_for_them() -> None:
    rate = ConnectRate(rate_per_s=2000, burst=50)
    assert all(rate.take("127.0.0.1", i / 1500) == 0.0 for i in range(10_000))


def test_the_buckets_are_bounded_least_recently_used_first() -> None:
    rate = ConnectRate(rate_per_s=1, burst=1, max_keys=3)
    for key in ("a", "b", "c"):
        rate.take(key, 0.0)
    rate.take("a", 0.0)  # refused, and now the most recently seen
    rate.take("d", 0.0)
    assert len(rate) == 3
    assert rate.take("a", 0.0) > 0  # kept
    assert rate.take("b", 0.0) == 0.0  # dropped, so forgiven


def test_keys_are_the_ipv4_address_or_the_ipv6_64() -> None:
    assert client_key(("127.0.0.1", 5000)) == "127.0.0.1"
    assert client_key(("::ffff:10.1.2.3", 5000, 0, 0)) == "10.1.2.3"
    assert client_key(("2001:db8:1:2:aaaa::1", 5000, 0, 0)) == "2001:db8:1:2::/64"
    assert client_key(("2001:db8:1:2:bbbb::9", 1, 0, 0)) == "2001:db8:1:2::/64"
    assert client_key(("fe80::1%eth0", 1, 0, 2)) == "fe80::/64"
    assert client_key("/tmp/socket") is None
    assert client_key(None) is None
    assert client_key(("not an ip", 1)) is None


def test_bad_rates_are_refused() -> None:
    for args in ((0, 1), (1, 0)):
        with pytest.raises(ValueError, match="rate_per_s"):
            ConnectRate(*args)


def test_refusals_are_counted_and_logged_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    now = [0.0]
    refusals = Refusals(logging.getLogger("t"), every_s=10, now=lambda: now[0])
    for i in range(100):
        now[0] = i * 0.1
        refusals.note("pre_auth_cap", "1000 open")  # 100 in 10 s
    now[0] = 5.0
    refusals.note("unauthorized", "token expired")
    now[0] = 10.0
    refusals.note("pre_auth_cap")
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (logging.WARNING, "refused 1 socket(s): pre_auth_cap (1000 open)"),
        (logging.INFO, "refused 1 socket(s): unauthorized (token expired)"),
        (logging.WARNING, "refused 100 socket(s): pre_auth_cap"),
    ]
    assert refusals.counts["pre_auth_cap"] == 101
    metrics = refusals.metrics()
    assert set(metrics) == {f"handshakes_refused_{k}" for k in REFUSALS}
    assert metrics["handshakes_refused_pre_auth_cap"][1] == 101
    assert metrics["handshakes_refused_full"][1] == 0


def test_the_connect_rate_is_off_by_default() -> None:
    # What the limits read from the settings: tests/unit/test_settings_limits.py.
    assert HandshakeLimits().connect_rate_per_ip is None  # off by default


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        (b"GET /ws?token=abc HTTP/1.1\r\n", True),
        (b"GET / HTTP/1.0\r\n", True),
        (b"\n", False),
        (b"\r\n", False),
        (b"junk\r\n", False),
        (b"GET /ws HTTP/1.1\n", False),  # no CR
        (b"GET /ws HTTP/2\r\n", False),
        (b"POST /ws HTTP/1.1\r\n", False),
        (b"GET  HTTP/1.1\r\n", False),  # no target
        (b"GET /a b HTTP/1.1\r\n", False),
        (b"GET /\xff HTTP/1.1\r\n", False),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\n", False),  # a TLS ClientHello
    ],
)
def test_only_a_request_line_is_a_request_line(line: bytes, ok: bool) -> None:
    assert request_line_ok(line) is ok
