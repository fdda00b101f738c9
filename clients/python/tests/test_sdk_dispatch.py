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


async def test_it_waits_out_503s_and_network_errors_and_counts_them() -> None:
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
    assert all(r.headers["Authorization"] == "Bearer tok" for r in seen)
    assert str(seen[0].url) == "http://api/v1/dispatch?zone=eu"
