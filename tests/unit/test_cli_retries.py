"""router.cli.rest.RestClient's retries over httpx.MockTransport (no network, no sleeps):
what is retried (no answer, 429, 503; a GET or a request with its Idempotency-Key),
with the same key each time, after Retry-After; and what is not."""

from __future__ import annotations

import httpx
import pytest
from pydantic import SecretStr

from router.cli.rest import ApiSettings, RemoteError, RestClient


def _client(
    answers: list[httpx.Response | Exception],
) -> tuple[RestClient, list[httpx.Request], list[float]]:
    seen: list[httpx.Request] = []
    slept: list[float] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    settings = ApiSettings(api_url="http://push", api_key=SecretStr("k" * 20))
    api = RestClient(settings, transport=httpx.MockTransport(handle), sleep=slept.append)
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


def test_retries_are_bounded_and_the_error_names_the_key_to_try_again_with() -> None:
    api, seen, slept = _client([httpx.ConnectError("refused")] * 4)
    with pytest.raises(RemoteError, match="--idempotency-key k-1"):
        api.call("POST", "/v1/push", {"to": ["a"]}, idempotency_key="k-1")
    assert len(seen) == 4 and len(slept) == 3


def test_a_get_is_retried_without_a_key() -> None:
    api, seen, _ = _client([httpx.ConnectError("refused"), OK])
    assert api.call("GET", "/v1/gateways") == {"push_id": "p1"}
    assert len(seen) == 2 and "idempotency-key" not in seen[0].headers
