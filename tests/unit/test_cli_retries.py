"""router.cli.rest.RestClient's retries over httpx.MockTransport (no network, no sleeps):
what is retried (no answer, 429, 503; a GET or a request with its Idempotency-Key),
with the same key each time, after Retry-After, each said; and what is not (no
connection: said at once)."""

from __future__ import annotations

import httpx
import pytest
from pydantic import SecretStr

from router.cli.rest import ApiSettings, RemoteError, RestClient
from tests.unit.scripted_http import Answer, scripted


def _client(
    answers: list[Answer], told: list[str] | None = None
) -> tuple[RestClient, list[httpx.Request], list[float]]:
    handle, seen = scripted(answers)
    slept: list[float] = []
    notify = (told if told is not None else []).append
    settings = ApiSettings(api_url="http://push", api_key=SecretStr("k" * 20))
    transport = httpx.MockTransport(handle)
    api = RestClient(settings, transport=transport, sleep=slept.append, notify=notify)
    return api, seen, slept


OK = httpx.Response(200, json={"push_id": "p1"})
BUSY = httpx.Response(
    503, json={"error": "overloaded", "detail": "…"}, headers={"Retry-After": "2"}
)


def test_no_answer_then_busy_then_ok_is_retried_with_the_same_key() -> None:
    api, seen, slept = _client([httpx.ReadError("reset"), BUSY, OK])
    assert api.call("POST", "/v1/push", {"to": ["a"]}, idempotency_key="k-1") == {"push_id": "p1"}
    assert [r.headers["idempotency-key"] for r in seen] == ["k-1"] * 3
    assert len({r.content for r in seen}) == 1  # the same bytes: the key's request hash
    assert len(slept) == 2 and 0.5 <= slept[0] <= 1.0 and slept[1] == 2.0  # Retry-After


def test_without_a_key_a_post_is_never_retried() -> None:
    api, seen, _ = _client([httpx.ReadError("reset")])
    with pytest.raises(RemoteError, match="cannot reach"):
        api.call("POST", "/v1/push", {"to": ["a"]})
    assert len(seen) == 1


@pytest.mark.parametrize("status", [400, 409, 422, 500])
def test_an_answer_other_than_429_or_503_is_final(status: int) -> None:
    api, seen, _ = _client([httpx.Response(status, json={"error": "x", "detail": "y"})])
    with pytest.raises(RemoteError) as info:
        api.call("POST", "/v1/push", {"to": ["a"]}, idempotency_key="k-1")
    assert info.value.status == status and len(seen) == 1


def test_retries_are_bounded_each_said_and_the_error_names_the_key_to_try_again_with() -> None:
    told: list[str] = []
    api, seen, slept = _client([httpx.ReadTimeout("timed out")] * 3, told)
    with pytest.raises(RemoteError) as raised:
        api.call("POST", "/v1/push", {"to": ["a"]}, idempotency_key="k-1")
    assert len(seen) == 3 and len(slept) == 2  # DEFAULT_RETRIES
    assert str(raised.value).startswith(
        "cannot reach the push service at http://push/v1/push: no answer within 10 s (3 tries)"
    )
    assert "--idempotency-key k-1" in str(raised.value)
    assert [t.split("; ")[0] for t in told] == ["http://push/v1/push: no answer within 10 s"] * 2
    assert "(retry 1 of 2)" in told[0] and "(retry 2 of 2)" in told[1]


def test_a_get_is_retried_without_a_key() -> None:
    api, seen, _ = _client([httpx.RemoteProtocolError("Server disconnected"), OK])
    assert api.call("GET", "/v1/gateways") == {"push_id": "p1"}
    assert len(seen) == 2 and "idempotency-key" not in seen[0].headers


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (httpx.ConnectError("[Errno 111] Connection refused"), "Connection refused"),
        (httpx.ConnectError("[Errno -2] Name or service not known"), "Name or service"),
        (httpx.ConnectTimeout("timed out"), "no connection within 10 s"),
    ],
)
@pytest.mark.parametrize("key", [None, "k-1"])
def test_no_connection_is_said_at_once_naming_the_url_and_not_retried(
    failure: Exception, said: str, key: str | None
) -> None:
    """Before: a refused connection was tried 4 times over 3.5-7 s (a connect that timed
    out, 4 times 30 s), silently."""
    told: list[str] = []
    api, seen, slept = _client([failure] * 4, told)
    with pytest.raises(RemoteError) as raised:
        api.call("GET" if key is None else "POST", "/v1/gateways", idempotency_key=key)
    assert len(seen) == 1 and slept == [] and told == []
    assert raised.value.status == 0
    assert str(raised.value).startswith("cannot reach the push service at http://push/v1/gateways")
    assert said in str(raised.value) and "--api-url" in str(raised.value)
