"""The operator commands' pure parts: their names, what they print, how a refusal reads
(the REST calls themselves: tests/integration/test_cli_remote.py)."""

from __future__ import annotations

import httpx
import pytest
from pydantic import SecretStr

from router.cli import REMOTE
from router.cli.remote import COMMANDS
from router.cli.rest import ApiSettings, RemoteError, RestClient
from router.cli.show import fleet_table, job_line, push_lines


def test_the_dispatch_list_names_every_command() -> None:
    assert tuple(COMMANDS) == REMOTE


def test_a_push_answer_reads_per_state_with_names() -> None:
    answer = {
        "push_id": "p1",
        "delivered": ["amy"],
        "offline": [],
        "queued": ["bob"],
        "failed": [],
        "errors": [{"gateway_id": "gw2", "error": "UNAVAILABLE: down"}],
        "acked": ["amy"],
        "unacked": ["bob"],
    }
    text = push_lines(answer)
    assert text.splitlines() == [
        "push p1: delivered 1 (amy), offline 0, queued 1 (bob), failed 0",
        "acked 1 (amy), unacked 1 (bob)",
        "  gw2: UNAVAILABLE: down",
    ]
    many = push_lines({"push_id": "p2", "delivered": [f"u{i}" for i in range(12)]})
    assert "delivered 12 (u0, u1, u2, u3, u4, u5, u6, u7, u8, u9, ...)" in many


def test_a_job_line_says_its_failures() -> None:
    job = {
        "mode": "multicast", "push_id": "p1", "status": "failed", "recipients": 3,
        "online": 2, "offline": 1, "published": 1, "batches": 2, "delivered": 2,
        "acked": 0, "queued": 1, "failed_batches": 1, "error": "bus down",
    }  # fmt: skip
    line = job_line(job)
    assert line.startswith("multicast p1 failed: 3 recipients (2 online, 1 offline)")
    assert "1/2 batches published" in line and "1 batches failed; error: bus down" in line


def test_the_fleet_table_sorts_by_group_and_marks_draining() -> None:
    gateways = [
        {"gateway_id": "b", "group_id": "g2", "ws_url": "ws://b", "connections": 3},
        {"gateway_id": "a", "group_id": "g1", "ws_url": "ws://a", "connections": 1,
         "max_connections": 10, "draining": True, "zone": "z1"},
    ]  # fmt: skip
    table = fleet_table(gateways)
    assert not isinstance(table, str)
    rows = list(zip(*(c.cells for c in table.columns), strict=True))
    assert rows == [
        ("g1", "a", "draining", "1/10", "25%", "z1", "ws://a"),
        ("g2", "b", "live", "3", "75%", "", "ws://b"),
    ]
    assert fleet_table([]) == "no live gateway"


def _client(status: int, body: object, admin: bool = False) -> RestClient:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization", ""))
        return httpx.Response(status, json=body)

    seen: list[str] = []
    keys = ApiSettings(api_key=SecretStr("push-key-0123456789"), admin_api_key=None)
    client = RestClient(keys, transport=httpx.MockTransport(answer))
    client.seen = seen  # type: ignore[attr-defined]
    return client


def test_a_refusal_names_the_fields_and_the_key_setting_never_the_key() -> None:
    body = {"error": "invalid_request", "detail": [{"field": "body.to", "message": "dupes"}]}
    with pytest.raises(RemoteError) as bad:
        _client(422, body).call("POST", "/v1/push", {})
    assert str(bad.value) == "POST /v1/push: 422 invalid_request: body.to: dupes"
    with pytest.raises(RemoteError) as denied:
        _client(403, {"error": "forbidden", "detail": "needs the admin key"}).call(
            "POST", "/v1/gateways/g/drain", admin=True
        )
    text = str(denied.value)
    assert "403 forbidden: needs the admin key" in text and "IMROUTE_ADMIN_API_KEY" in text
    assert "push-key" not in text
    ok = _client(200, {"gateways": []})
    assert ok.call("GET", "/v1/gateways") == {"gateways": []}
    # Without an admin key, the API key holds both roles.
    ok.call("POST", "/v1/gateways/g/drain", admin=True)
    assert ok.seen == ["Bearer push-key-0123456789"] * 2  # type: ignore[attr-defined]
