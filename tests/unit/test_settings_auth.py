from __future__ import annotations

from collections.abc import Callable

import jwt
import pytest

from router.bus.redis_streams import RedisStreamsBus
from router.redis.client import create_redis
from router.testing import ManualClock
from shared.auth import api_key_matches, issue_token, verify_token
from shared.errors import AuthError, ConfigError
from shared.settings import Settings, redact_url

SECRET = "s" * 32


def test_env_then_flags() -> None:
    s = Settings.load({"IMROUTE_PORT": "9000", "IMROUTE_GROUP_ID": "g7"}, port=9001)
    assert s.port == 9001
    assert s.group_id == "g7"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"IMROUTE_PORT": "eighty"}, "IMROUTE_PORT"),
        ({"IMROUTE_WS_PORT": "70000"}, "IMROUTE_WS_PORT"),
        ({"IMROUTE_REDIS_URL": "http://x"}, "IMROUTE_REDIS_URL"),
        ({"IMROUTE_GATEWAY_ID": "gw|1"}, "IMROUTE_GATEWAY_ID"),
        ({"IMROUTE_API_KEY": "short"}, "IMROUTE_API_KEY"),
        ({"IMROUTE_SECRET": "x" * 31}, "IMROUTE_SECRET"),
        # a check across settings names each variable, with no "settings: Value error,"
        (
            {"IMROUTE_HEARTBEAT_S": "40", "IMROUTE_ROUTE_TTL_S": "60"},
            r"configuration: IMROUTE_HEARTBEAT_S \(40.0\) must be at most half of "
            r"IMROUTE_ROUTE_TTL_S \(60.0\)",
        ),
        # the HTTP edge's limits
        ({"IMROUTE_HTTP_HEADER_TIMEOUT_S": "0"}, "IMROUTE_HTTP_HEADER_TIMEOUT_S"),
        ({"IMROUTE_HTTP_HEADER_TIMEOUT_S": "301"}, "IMROUTE_HTTP_HEADER_TIMEOUT_S"),
        ({"IMROUTE_HTTP_KEEPALIVE_TIMEOUT_S": "0"}, "IMROUTE_HTTP_KEEPALIVE_TIMEOUT_S"),
        ({"IMROUTE_HTTP_KEEPALIVE_TIMEOUT_S": "1.5"}, "IMROUTE_HTTP_KEEPALIVE_TIMEOUT_S"),
        ({"IMROUTE_HTTP_MAX_CONCURRENCY": "0"}, "IMROUTE_HTTP_MAX_CONCURRENCY"),
        # the WebSocket client limits
        ({"IMROUTE_MAX_CONNECTIONS_PER_USER": "-1"}, "IMROUTE_MAX_CONNECTIONS_PER_USER"),
        ({"IMROUTE_WS_CLIENT_FRAME_RATE": "-5"}, "IMROUTE_WS_CLIENT_FRAME_RATE"),
        ({"IMROUTE_WS_CLIENT_FRAME_BURST": "0"}, "IMROUTE_WS_CLIENT_FRAME_BURST"),
        # the token rules and the handshake's limits
        ({"IMROUTE_JWT_LEEWAY_S": "-1"}, "IMROUTE_JWT_LEEWAY_S"),
        ({"IMROUTE_JWT_MAX_TTL_S": "soon"}, "IMROUTE_JWT_MAX_TTL_S"),
        ({"IMROUTE_JWT_AUDIENCE": ""}, "IMROUTE_JWT_AUDIENCE"),
        ({"IMROUTE_WS_MAX_PRE_AUTH": "0"}, "IMROUTE_WS_MAX_PRE_AUTH"),
        ({"IMROUTE_WS_HANDSHAKE_TIMEOUT_S": "0"}, "IMROUTE_WS_HANDSHAKE_TIMEOUT_S"),
        ({"IMROUTE_WS_CONNECT_RATE_PER_IP": "-3"}, "IMROUTE_WS_CONNECT_RATE_PER_IP"),
    ],
)
def test_bad_values_name_the_setting(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Settings.load(env)


def test_secrets_do_not_show_in_repr_or_errors() -> None:
    s = Settings.load({"IMROUTE_API_KEY": "k" * 20, "IMROUTE_SECRET": "z" * 40})
    assert "kkkk" not in repr(s) and "zzzz" not in repr(s)
    with pytest.raises(ConfigError) as info:
        Settings.load({"IMROUTE_API_KEY": "tooshort-secret"})
    assert "tooshort-secret" not in str(info.value)
    assert redact_url("redis://:hunter2@h:6379/0") == "redis://:***@h:6379/0"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://bob:hunter2@h:6379/0", "redis://bob:***@h:6379/0"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("redis://user@h/0", "redis://user@h/0"),  # a name alone is no secret
        # Before: a password in the query, or holding an unencoded "/" or "#", showed.
        ("redis://h:6399/0?password=hunter2&db=1", "redis://h:6399/0?password=***&db=1"),
        (
            "postgresql+asyncpg://u@h/db?sslpassword=p1&PWD=p2",
            "postgresql+asyncpg://u@h/db?sslpassword=***&PWD=***",
        ),
        ("redis://:hun/ter#2@h:6379/0", "redis://:***@h:6379/0"),
        ("postgresql+asyncpg://u:p?ss@h/db", "postgresql+asyncpg://u:***@h/db"),
        # an "@" past the authority is no userinfo's end
        (
            "https://hooks.example.com:8443/u/ops@team.example/n",
            "https://hooks.example.com:8443/u/ops@team.example/n",
        ),
        ("http://[::1]:8080/a@b", "http://[::1]:8080/a@b"),
        ("http://h:80/#a@b", "http://h:80/#a@b"),
        ("http://u:p@[::1]:8080/x", "http://u:***@[::1]:8080/x"),
        ("http://bob:hunter2@127.0.0.1:1/v1", "http://bob:***@127.0.0.1:1/v1"),
        ("not a url", "not a url"),
    ],
)
def test_redact_url_hides_every_password_it_can_find(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_url_the_client_cannot_read_is_named_without_its_password() -> None:
    """redis-py's own words quote the password cut short by an unencoded "#" ("Port
    could not be cast to integer value as 'Sup3rS3cret'"): they are not shown."""
    makers: list[tuple[Callable[[str], object], str]] = [
        (create_redis, "IMROUTE_REDIS_URL"),
        (lambda url: RedisStreamsBus(url, "p:"), "IMROUTE_BUS_URL"),
    ]
    for make, setting in makers:
        with pytest.raises(ConfigError) as info:
            make("redis://:Sup3rS3cret#tail@h:6379/0")
        message = str(info.value)
        assert "Sup3r" not in message and "tail" not in message, message
        assert message.startswith(f"{setting}: redis://:***@h:6379/0 cannot be read"), message
        assert "percent-encoded" in message
        # A URL without a secret keeps the library's reason.
        with pytest.raises(ConfigError, match=f"^{setting}: Port could not be cast"):
            make("redis://h:63x79/0")


def test_token_round_trip_and_expiry() -> None:
    clock = ManualClock()
    token = issue_token(SECRET, "alice", 60, clock)
    assert verify_token(SECRET, token, clock) == "alice"
    clock.advance(60 + 29)  # within the default 30 s leeway
    assert verify_token(SECRET, token, clock) == "alice"
    clock.advance(1)
    with pytest.raises(AuthError, match="expired"):
        verify_token(SECRET, token, clock)


@pytest.mark.parametrize(
    "token",
    [
        None,
        "",
        "garbage",
        jwt.encode({"sub": "alice"}, SECRET, algorithm="HS256"),  # no exp
        jwt.encode({"exp": 2**40}, SECRET, algorithm="HS256"),  # no sub
        jwt.encode({"sub": "alice", "exp": 2**40}, "o" * 32, algorithm="HS256"),
        jwt.encode({"sub": "alice", "exp": 2**40}, SECRET * 2, algorithm="HS512"),
        jwt.encode({"sub": "", "exp": 2**40}, SECRET, algorithm="HS256"),
    ],
)
def test_bad_tokens_are_rejected(token: str | None) -> None:
    with pytest.raises(AuthError):
        verify_token(SECRET, token, ManualClock())


def test_api_key_comparison() -> None:
    assert api_key_matches("abc", "abc")
    assert not api_key_matches("abc", "abd")
    assert not api_key_matches("abc", "")
