"""One uid rule at every way in: a uid with a control character (a newline, a terminal
escape, NUL, a bidi override) is refused by the HTTP API (422 naming the field), the
gateway and dispatch (401 naming `sub`), the directory and the CLI (naming the line,
never echoing it). Real gateway, push API, Redis, WebSocket clients and CLI processes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import jwt
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from router.processes.ports import free_port
from shared.clock import SystemClock
from tests.conftest import SECRET
from tests.integration.procs import (
    base_env,
    gateway_process,
    imroute,
    push_services,
    scrape,
    service_env,
)
from tests.integration.stack import AUTH, client, nothing_more, one_group

pytestmark = pytest.mark.integration

BAD = {
    "newline": "eve\nINFO forged log line",
    "escape": "eve\x1b]0;pwned\x07\x1b[2J",
    "nul": "eve\x00",
    "del": "eve\x7f",
    "c1": "eve\x9b31m",
    "bidi": "eve\u202egpj.exe",
    "line-separator": "eve\u2028x",
}


def sub_token(sub: Any) -> str:
    now = SystemClock().now_ms() // 1000
    return jwt.encode({"sub": sub, "iat": now, "exp": now + 600}, SECRET, "HS256")


async def refused(http: httpx.AsyncClient) -> float:
    scrape = (await http.get("/metrics")).text
    found = re.search(r"^imroute_uids_refused_total (\S+)$", scrape, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.usefixtures("redis")
@pytest.mark.parametrize("kind", list(BAD))
async def test_the_api_refuses_a_bad_uid_with_422_naming_the_field(
    redis_url: str, prefix: str, kind: str
) -> None:
    bad = BAD[kind]
    async with one_group(redis_url, prefix) as (gw, http):
        before = await refused(http)
        async with client(gw, "alice") as ws:
            calls = [
                ("POST", "/v1/push", {"to": ["alice", bad], "content": 1}, "body.to.1"),
                (
                    "POST",
                    "/v1/push/batch",
                    {"messages": [{"to": [bad], "content": 1}]},
                    "body.messages.0.to.0",
                ),
                ("POST", "/v1/multicast", {"to": ["alice", bad], "content": 1}, "body.to.1"),
                ("PUT", "/v1/users", {"users": [{"uid": "ok"}, {"uid": bad}]}, "body.users.1.uid"),
            ]
            for method, path, body, field in calls:
                resp = await http.request(method, path, json=body, headers=AUTH)
                answer = resp.json()
                if path == "/v1/push/batch":
                    assert resp.status_code == 200, resp.text
                    (answer,) = answer["results"]
                    assert answer["status"] == 422, answer
                else:
                    assert resp.status_code == 422, (path, resp.text)
                    assert answer["error"] == "invalid_request"
                assert field in [d["field"] for d in answer["detail"]], (path, answer)
            assert await nothing_more(ws, 0.1)
        assert gw.deliver_service.calls == 0
        q = quote(bad, safe="")
        for method, url, field in _uid_urls(q):
            resp = await http.request(method, url, headers=AUTH)
            assert resp.status_code == 422, (url, resp.text)
            assert field in [d["field"] for d in resp.json()["detail"]], resp.text
        # Counted, each refused uid once (the batch's fast path falls back to the model).
        assert await refused(http) - before == 7


@pytest.mark.usefixtures("redis")
@pytest.mark.parametrize("kind", list(BAD))
async def test_a_token_whose_sub_breaks_the_rule_gets_401_at_the_gateway_and_dispatch(
    redis_url: str, prefix: str, kind: str
) -> None:
    tok = sub_token(BAD[kind])
    async with one_group(redis_url, prefix) as (gw, http):
        with pytest.raises(InvalidStatus) as info:
            async with connect(f"ws://127.0.0.1:{gw.ws_port}/ws?token={tok}"):
                pass
        response = info.value.response
        assert response.status_code == 401
        answer = json.loads(response.body)
        assert answer["error"] == "unauthorized" and "sub:" in answer["detail"]
        assert BAD[kind].encode() not in bytes(response.body)
        assert gw.ws_endpoint is not None and len(gw.conns) == 0
        assert gw.ws_endpoint.refusals.counts["unauthorized"] == 1
        resp = await http.get("/v1/dispatch", headers={"Authorization": f"Bearer {tok}"})
        assert resp.status_code == 401 and "sub:" in resp.json()["detail"]


def test_imroute_token_refuses_a_bad_uid_without_echoing_it() -> None:
    done = imroute("token", BAD["escape"], env=base_env(IMROUTE_SECRET=SECRET))
    assert done.returncode == 2 and done.stdout == ""
    assert "imroute token: uid: must not hold control characters" in done.stderr
    assert "\x1b" not in done.stderr and "pwned" not in done.stderr
    assert imroute("token", "bob{corp}", env=base_env(IMROUTE_SECRET=SECRET)).returncode == 0


def test_users_import_names_the_line_and_echoes_nothing(tmp_path: Path) -> None:
    db = f"sqlite+aiosqlite:///{tmp_path}/users.db"
    env = base_env(IMROUTE_DB_URL=db)
    assert imroute("db", "upgrade", env=env).returncode == 0
    data = tmp_path / "users.jsonl"
    rows = [{"uid": "ok"}, {"uid": BAD["escape"]}, {"uid": BAD["bidi"]}, {"uid": "fine"}]
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    done = imroute("users", "import", str(data), env=env)
    assert "imported 2 users, skipped 2 bad lines" in done.stdout
    assert f"{data}:2: uid: must not hold control characters: U+001B" in done.stderr
    assert f"{data}:3: uid: must not hold control characters: U+202E" in done.stderr
    assert "\x1b" not in done.stderr and "\u202e" not in done.stderr
    assert "pwned" not in done.stderr and "gpj" not in done.stderr
    # Every line bad: nothing imported, exit 1.
    data.write_text(json.dumps({"uid": BAD["nul"]}) + "\n")
    assert imroute("users", "import", str(data), env=env).returncode == 1
    # A CSV whose first line is no header is named by its line, not quoted.
    csv = tmp_path / "users.csv"
    csv.write_text("\x1b]0;pwned\x07\x1b[2J,tags\nalice,red\n")
    done = imroute("users", "import", str(csv), env=env)
    assert done.returncode == 2 and f"{csv}:1: the CSV header must name a uid column" in done.stderr
    assert "\x1b" not in done.stderr and "pwned" not in done.stderr


def _uid_urls(uid: str) -> list[tuple[str, str, str]]:
    """(method, URL, the field a refusal names) of each way a uid comes in by a URL."""
    return [
        ("GET", f"/v1/users/{uid}/route", "path.uid"),
        ("DELETE", f"/v1/users/{uid}", "path.uid"),
        ("GET", f"/v1/pushes/p1/recipients?state=acked&cursor={uid}", "query.cursor"),
    ]


async def test_a_uid_too_long_in_a_path_or_a_cursor_is_refused_by_the_rule_and_counted(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """A real push service: the one rule refuses a 129-character uid wherever it comes,
    with its own message, and counts it (pydantic's own length check came first)."""
    env = service_env(redis_url, prefix, tmp_path)
    port = free_port()
    long = "x" * 129
    async with (
        push_services(env, [port]),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        before = await refused(http)
        for method, url, field in _uid_urls(long):
            resp = await http.request(method, url, headers=AUTH)
            assert resp.status_code == 422, (url, resp.text)
            detail = {d["field"]: d["message"] for d in resp.json()["detail"]}
            assert "must be 1-128 characters, got 129" in detail.get(field, ""), resp.text
        assert await refused(http) - before == 3


async def test_a_uid_holding_a_slash_is_put_read_and_deleted_through_the_api(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """The rule allows "/", so the API's paths take it: sent as %2F or as is, and a uid
    ending in "/route" too (a real push service under uvicorn)."""
    env = service_env(redis_url, prefix, tmp_path)
    assert imroute("db", "upgrade", env=env).returncode == 0
    port = free_port()
    uids = ["team/alice", "a/route", "/lead", "x//y/"]
    async with (
        push_services(env, [port]),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        resp = await http.put("/v1/users", json={"users": [{"uid": u} for u in uids]}, headers=AUTH)
        assert resp.json() == {"upserted": len(uids)}, resp.text
        for uid in uids:
            for path in (quote(uid, safe=""), uid):
                resp = await http.get(f"/v1/users/{path}/route", headers=AUTH)
                assert resp.status_code == 200, (uid, path, resp.text)
                assert resp.json() == {"uid": uid, "online": False, "routes": []}
            # No key: the gate refuses before the app, as for any uid.
            assert (await http.delete(f"/v1/users/{quote(uid, safe='')}")).status_code == 401
        for uid in uids:
            resp = await http.delete(f"/v1/users/{quote(uid, safe='')}", headers=AUTH)
            assert resp.status_code == 204, (uid, resp.text)
            assert (await http.delete(f"/v1/users/{uid}", headers=AUTH)).status_code == 404


async def test_the_gateway_exports_its_refused_uids(redis_url: str, prefix: str) -> None:
    """A real gateway process counts a token's bad sub in its /metrics."""
    async with gateway_process(redis_url, prefix) as (ws_port, _, metrics_port):
        before = (await scrape(metrics_port, "imroute_gateway_")).get("uids_refused_total")
        assert before == 0.0
        for kind in ("newline", "bidi"):
            with pytest.raises(InvalidStatus) as info:
                async with connect(f"ws://127.0.0.1:{ws_port}/ws?token={sub_token(BAD[kind])}"):
                    pass
            assert info.value.response.status_code == 401
        counts = await scrape(metrics_port, "imroute_gateway_")
        assert counts["uids_refused_total"] == 2.0
        assert counts["handshakes_refused_unauthorized_total"] == 2.0
