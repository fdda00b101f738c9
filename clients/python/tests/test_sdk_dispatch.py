"""Reading dispatch's answers, and asking until it names a gateway (on httpx's mock
transport: the HTTP exchange is httpx's, the decisions are ours)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import pytest
from imroute_client.backoff import Backoff
from imroute_client.dispatch import Target, ask_dispatch, read_dispatch
from imroute_client.errors import DispatchRefused, Unauthorized

B = Backoff(0.001, 0.01)
OK = {"ws_url": "ws://h:1/ws", "gateway_id": "gw1", "group_id": "g1"}


def read(status: int, body: Any, ra: str | None = None) -> Target | float | None:
    return read_dispatch(status, body, ra, B, lambda: 0.0)


def test_answers() -> None:
    assert read(200, OK) == Target("ws://h:1/ws", "gw1", "g1")
    assert read(200, {"ws_url": 1}) is None
    assert read(503, {}, "0.005") == pytest.approx(0.005)
    assert read(503, {}) is None
    assert read(502, "bad gateway") is None
    with pytest.raises(Unauthorized, match="401"):
        read(401, {"error": "unauthorized"})
    with pytest.raises(DispatchRefused, match="404"):
        read(404, "not found")


async def test_it_waits_out_503s_and_network_errors_and_counts_and_logs_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers: list[httpx.Response | Exception] = [
        httpx.Response(503, headers={"Retry-After": "0"}, json={"error": "no gateway"}),
        httpx.ConnectError("refused"),
        httpx.Response(200, json=OK),
    ]
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    errors: Counter[str] = Counter()
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        target = await ask_dispatch(http, "http://api/", "tok", zone="eu", backoff=B,
                                    rand=lambda: 0.0, errors=errors)  # fmt: skip
    assert target.gateway_id == "gw1"
    assert errors == {"503": 1, "ConnectError": 1}
    # Each failure said: a wrong api_url waited in silence.
    said = [r.getMessage() for r in caplog.records if r.name == "imroute_client"]
    assert len(said) == 2 and "answered 503" in said[0], said
    assert "no answer (ConnectError)" in said[1] and "http://api/v1/dispatch" in said[1]
    assert all(r.headers["Authorization"] == "Bearer tok" for r in seen)
    assert str(seen[0].url) == "http://api/v1/dispatch?zone=eu"


async def test_a_password_in_the_api_url_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    answers = [httpx.Response(502), httpx.Response(200, json=OK)]
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda _: answers.pop(0))) as http:
        await ask_dispatch(http, "https://u:hunter2@api", "tok", zone=None, backoff=B,
                           rand=lambda: 0.0, errors=Counter())  # fmt: skip
    [said] = [r.getMessage() for r in caplog.records if r.name == "imroute_client"]
    assert "https://api/v1/dispatch answered 502" in said and "hunter2" not in said
