"""HTTP fuzzing: schemathesis against the push service's OpenAPI schema.

A real `python -m push_service` with real Redis, a migrated directory and one real
gateway process, so generated requests reach the handlers (with the API key, which with
no admin key set holds both scopes; with a client JWT on /v1/dispatch) and the router
behind them. Every operation gets schemathesis' example, coverage (boundary values and
unexpected methods) and fuzzing phases, with valid and invalid data. No answer may be
a 5xx, and every 4xx is JSON in our error shape `{"error": str, "detail": ...}`. A
shorter run without a key: every protected operation is refused with 401 before its
handler runs.

Bounded: KEYED_EXAMPLES and KEYLESS_EXAMPLES per operation and generation mode in the
fuzzing phase (the coverage phase adds a fixed set), under a minute on 2 cores.

The schema is built from `create_app` at import (schemathesis parametrizes tests when
the module is collected, before any process runs; its lazy fixture loader does not
work with pytest 9); `test_the_process_serves_the_schema_fuzzed` checks that the
running process publishes that same document.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import requests
import schemathesis
from hypothesis import strategies as st
from schemathesis import Case, Response
from schemathesis.schemas import BaseSchema

from push_service.app import create_app
from router.directory.migrate import upgrade
from shared.settings import Settings
from tests.conftest import API_KEY, SECRET
from tests.integration.http_raw import push_service
from tests.integration.procs import BIN, directory_url, gateway_env, read_until, running
from tests.integration.stack import token

pytestmark = pytest.mark.integration

KEYED_EXAMPLES = 100
KEYLESS_EXAMPLES = 10
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PUBLIC = {"/v1/dispatch", "/healthz"}  # every other path needs a key


def _openapi() -> dict[str, object]:
    return create_app(Settings.load({}, api_key=API_KEY, secret=SECRET)).openapi()


def _schema(max_examples: int) -> BaseSchema:
    config = schemathesis.Config.from_dict(
        {
            "generation": {
                "mode": "all",  # valid and invalid data
                "max-examples": max_examples,
                "database": "none",  # no .hypothesis folder in the checkout
            },
            "request-timeout": 10,
        }
    )
    return schemathesis.openapi.from_dict(_openapi(), config=config)


KEYED = _schema(KEYED_EXAMPLES)
KEYLESS = _schema(KEYLESS_EXAMPLES)

HALF_AN_EMOJI = "\ud83d"  # what a JS client sends when it cuts a string inside an emoji


def _string_spots(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Where `value` holds strings: paths to string leaves, and to dict keys ("key", k)."""
    if isinstance(value, str):
        yield at
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _string_spots(item, (*at, i))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield (*at, ("key", key))
            yield from _string_spots(item, (*at, key))


def _cut(value: Any, at: tuple[Any, ...]) -> Any:
    if not at:
        return value + HALF_AN_EMOJI
    step, rest = at[0], at[1:]
    if isinstance(step, tuple):  # a dict key
        return {(k + HALF_AN_EMOJI if k == step[1] else k): v for k, v in value.items()}
    copy = list(value) if isinstance(value, list) else dict(value)
    copy[step] = _cut(value[step], rest)
    return copy


@KEYED.hook
def flatmap_body(context: schemathesis.HookContext, body: Any) -> st.SearchStrategy[Any]:
    """Generated bodies hold only valid Unicode; JSON also carries lone surrogates, which
    JS clients produce. Half of the bodies get one in one of their strings or keys."""
    spots = list(_string_spots(body))
    if not spots:
        return st.just(body)
    return st.one_of(st.just(body), st.sampled_from(spots).map(lambda at: _cut(body, at)))


@pytest.fixture(scope="module")
def base_url(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The push service and a gateway, as processes, for the whole module."""
    prefix = f"imroute-test:{uuid.uuid4().hex[:12]}:"
    tmp = tmp_path_factory.mktemp("fuzz")
    asyncio.run(upgrade(directory_url(tmp)))
    gw_env = gateway_env(redis_url, prefix)
    gateway_argv = [
        str(BIN / "imroute"),
        *("gateway", "--id", "gw1", "--group", "g1", "--ws-port", "0", "--grpc-port", "0"),
    ]
    try:
        with (
            running(gateway_argv, gw_env) as gw,
            push_service(redis_url, prefix, tmp) as (_, port),
        ):
            read_until(gw, "ready")
            yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            if keys:
                client.delete(*keys)


def _check(case: Case, response: Response) -> None:
    """No 5xx; a 4xx is JSON `{"error": str, "detail": ...}`."""
    where = f"{case.method} {case.formatted_path} -> {response.status_code}"
    reproduce = case.as_curl_command()
    assert response.status_code < 500, f"{where}: {response.text[:500]!r}\n{reproduce}"
    if response.status_code >= 400:
        content_type = response.headers.get("content-type", [""])[0]
        assert content_type.startswith("application/json"), f"{where}: {content_type}\n{reproduce}"
        body = json.loads(response.content)
        assert isinstance(body, dict) and isinstance(body.get("error"), str), (where, body)
        assert "detail" in body, (where, body)


def test_the_process_serves_the_schema_fuzzed(base_url: str) -> None:
    assert requests.get(f"{base_url}/openapi.json", timeout=10).json() == _openapi()


@KEYED.parametrize()
def test_with_the_key_no_answer_is_a_5xx_and_every_4xx_is_json(case: Case, base_url: str) -> None:
    # Dispatch takes a client's JWT, not the key. (Where the case generates its own
    # Authorization header, in negative mode, that one is sent.)
    headers = {"Authorization": f"Bearer {token('fuzz')}"} if case.path == "/v1/dispatch" else AUTH
    _check(case, case.call(base_url=base_url, headers=headers))


@KEYLESS.parametrize()
def test_without_a_key_protected_operations_are_401_before_any_handler(
    case: Case, base_url: str
) -> None:
    response = case.call(base_url=base_url)
    _check(case, response)
    if case.path in PUBLIC:
        return
    # The gate answers 401 for every method of a protected path. A path the router
    # cannot match (a generated parameter with a '/' in it) is the router's 404; any
    # other answer (a 422, a handler's 404) would mean a handler ran without a key.
    body = response.json()
    assert response.status_code == 401 or (response.status_code, body["detail"]) == (
        404,
        "Not Found",
    ), (case.method, case.formatted_path, response.status_code, body)
