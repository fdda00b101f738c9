"""The key scopes and the gate's rules (push_service.admission), and their
settings: pure, no server."""

from __future__ import annotations

import re

import pytest

from push_service.admission import AccessRules, ApiKeys, Scope, authorize, bearer_token
from shared.errors import ConfigError
from shared.settings import Settings

PUSH_KEY = "p" * 20
ADMIN_KEY = "a" * 20


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("Bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("abc", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_without_an_admin_key_the_push_key_holds_both_scopes() -> None:
    keys = ApiKeys(PUSH_KEY)
    assert authorize(keys, PUSH_KEY, Scope.PUSH) is None
    assert authorize(keys, PUSH_KEY, Scope.ADMIN) is None
    denial = authorize(keys, None, Scope.ADMIN)
    assert denial is not None and denial.status == 401
    assert denial.detail == "missing API key (Authorization: Bearer <IMROUTE_API_KEY>)"
    denial = authorize(keys, "x" * 20, Scope.PUSH)
    assert denial is not None and (denial.status, denial.error) == (401, "unauthorized")
    assert denial.detail.startswith("invalid API key") and denial.www_authenticate == "Bearer"


def test_with_an_admin_key_each_key_holds_its_own_scope_only() -> None:
    keys = ApiKeys(PUSH_KEY, ADMIN_KEY)
    assert authorize(keys, PUSH_KEY, Scope.PUSH) is None
    assert authorize(keys, ADMIN_KEY, Scope.ADMIN) is None
    denial = authorize(keys, PUSH_KEY, Scope.ADMIN)
    assert denial is not None and (denial.status, denial.error) == (403, "forbidden")
    assert "admin scope" in denial.detail and "IMROUTE_ADMIN_API_KEY" in denial.detail
    assert denial.www_authenticate == 'Bearer error="insufficient_scope", scope="admin"'
    denial = authorize(keys, ADMIN_KEY, Scope.PUSH)
    assert denial is not None and denial.status == 403 and "push scope" in denial.detail
    denial = authorize(keys, "x" * 20, Scope.ADMIN)
    assert denial is not None and denial.status == 401
    assert "IMROUTE_ADMIN_API_KEY" in denial.detail
    # Neither key's text is ever echoed back.
    for presented in (PUSH_KEY, ADMIN_KEY, "x" * 20):
        for scope in Scope:
            denial = authorize(keys, presented, scope)
            assert denial is None or (
                PUSH_KEY not in denial.detail and ADMIN_KEY not in denial.detail
            )


def test_keys_from_settings_and_their_checks() -> None:
    settings = Settings.load({"IMROUTE_API_KEY": PUSH_KEY, "IMROUTE_ADMIN_API_KEY": ADMIN_KEY})
    assert ApiKeys.from_settings(settings) == ApiKeys(PUSH_KEY, ADMIN_KEY)
    assert ApiKeys.from_settings(Settings.load({"IMROUTE_API_KEY": PUSH_KEY})).admin is None
    with pytest.raises(ConfigError, match=r"IMROUTE_ADMIN_API_KEY: .*at least 16") as info:
        Settings.load({"IMROUTE_API_KEY": PUSH_KEY, "IMROUTE_ADMIN_API_KEY": "short-secret"})
    assert "short-secret" not in str(info.value)
    with pytest.raises(ConfigError, match=r"IMROUTE_ADMIN_API_KEY: .*must differ") as info:
        Settings.load({"IMROUTE_API_KEY": PUSH_KEY, "IMROUTE_ADMIN_API_KEY": PUSH_KEY})
    assert PUSH_KEY not in str(info.value)


def test_http_limit_defaults() -> None:
    s = Settings.load({})
    assert (s.http_header_timeout_s, s.http_keepalive_timeout_s) == (10.0, 5)
    assert s.http_max_concurrency == 10_000


SCHEMES = {"PushKey": Scope.PUSH, "AdminKey": Scope.ADMIN}
SCHEMA = {
    "paths": {
        "/v1/push": {"post": {"security": [{"PushKey": []}]}},
        "/v1/users": {"put": {"security": [{"AdminKey": []}]}},
        "/v1/users/{uid}": {
            "get": {"security": [{"PushKey": []}]},
            "delete": {"security": [{"AdminKey": []}]},
        },
        "/v1/users/me": {"get": {}},  # a static path a template also matches
        "/v1/dispatch": {"get": {"security": [{"ClientToken": []}]}},
        "/healthz": {"get": {}},
    }
}


@pytest.mark.parametrize(
    ("method", "path", "needed"),
    [
        ("POST", "/v1/push", Scope.PUSH),
        ("GET", "/v1/push", Scope.PUSH),  # a 405 to come: still not without the key
        ("PUT", "/v1/users", Scope.ADMIN),
        ("GET", "/v1/users/alice", Scope.PUSH),
        ("DELETE", "/v1/users/alice", Scope.ADMIN),
        ("POST", "/v1/users/alice", Scope.ADMIN),  # the strictest of the path's
        ("GET", "/v1/users/me", Scope.PUSH),  # the template's scope, the stricter
        ("GET", "/v1/users/a/b", None),  # no route: the router's 404
        ("GET", "/v1/dispatch", None),  # a client token is not one of the keys
        ("GET", "/healthz", None),
        ("GET", "/metrics", None),
        ("GET", "/v1/unknown", None),
    ],
)
def test_access_rules_from_the_schema(method: str, path: str, needed: Scope | None) -> None:
    assert AccessRules.from_openapi(SCHEMA, SCHEMES).needed(method, path) is needed


def test_a_parameter_that_spans_segments_is_matched_as_the_router_matches_it() -> None:
    """`{uid:uid}` (push_service.routes.users): the OpenAPI form says one segment, the
    router's pattern says any; a GET of `.../route` is the GET route's, though the
    DELETE's pattern matches too."""
    schema = {
        "paths": {
            "/v1/users/{uid}/route": {"get": {"security": [{"PushKey": []}]}},
            "/v1/users/{uid}": {"delete": {"security": [{"AdminKey": []}]}},
        }
    }
    regexes = {
        "/v1/users/{uid}/route": re.compile(r"^/v1/users/(?P<uid>[\s\S]*)/route$"),
        "/v1/users/{uid}": re.compile(r"^/v1/users/(?P<uid>[\s\S]*)$"),
    }
    rules = AccessRules.from_openapi(schema, SCHEMES, regexes)
    assert rules.needed("GET", "/v1/users/team/alice/route") is Scope.PUSH
    assert rules.needed("GET", "/v1/users/alice/route") is Scope.PUSH
    assert rules.needed("DELETE", "/v1/users/team/alice") is Scope.ADMIN
    assert rules.needed("DELETE", "/v1/users/alice/route") is Scope.ADMIN  # uid "alice/route"
    assert rules.needed("POST", "/v1/users/team/alice/route") is Scope.ADMIN  # a 405: strictest
