"""The HTTP edge's contract on the in-memory stores: bad input is a clear 4xx JSON error
and nothing is sent, keys and their scopes, body limits, the status of a push, the
schema. (Over real Redis, gateways and sockets: tests/integration.)"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import pytest

from push_service.idempotency.base import Answer
from push_service.testing import MemoryIdempotencyStore
from shared.errors import RegistryUnavailable
from shared.models import GatewayInfo
from tests.api.conftest import Api, Fakes, serve
from tests.conftest import (
    ADMIN_KEY,
    API_KEY,
    BAD_IDEMPOTENCY_KEYS,
    LONE_SURROGATES,
    MALFORMED_PUSHES,
    invalid_details,
)

pytestmark = pytest.mark.api

AUTH = {"Authorization": f"Bearer {API_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
MIB = 1 << 20


@pytest.mark.parametrize(
    ("body", "field"),
    MALFORMED_PUSHES,
)
async def test_malformed_push_is_422_naming_the_field(
    api: Api, fakes: Fakes, body: dict[str, Any], field: str
) -> None:
    async with api() as http:
        resp = await http.post("/v1/push", json=body, headers=AUTH)
        assert field in [d["field"] for d in invalid_details(resp)], resp.text
        assert fakes.nothing_sent()


@pytest.mark.parametrize("path", ["/v1/push", "/v1/broadcast", "/v1/multicast"])
@pytest.mark.parametrize("sent", [None, "application/x-www-form-urlencoded", "text/plain"])
async def test_a_body_not_sent_as_json_is_422_naming_the_content_type(
    api: Api, fakes: Fakes, path: str, sent: str | None
) -> None:
    """`curl -d '{...}'` without `-H 'Content-Type: application/json'` sends a form: the
    answer says what the API takes, not pydantic's "a valid dictionary"."""
    headers = AUTH if sent is None else {**AUTH, "Content-Type": sent}
    async with api() as http:
        resp = await http.post(path, content=b'{"to":["a"],"content":1}', headers=headers)
        assert resp.status_code == 422, resp.text
        [detail] = invalid_details(resp)
        assert detail["field"] == "body"
        assert "Content-Type: application/json" in detail["message"], detail
        assert f"(this request's: {sent or 'none'})" in detail["message"], detail
        assert fakes.nothing_sent()


async def test_invalid_json_is_422(api: Api) -> None:
    async with api() as http:
        resp = await http.post(
            "/v1/push",
            content=b'{"to": ["a"], "content": ',
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert resp.status_code == 422
        assert resp.json()["error"] == "invalid_request"
        assert resp.json()["detail"][0]["field"] == "body"
        assert "invalid JSON at character" in resp.json()["detail"][0]["message"]
        resp = await http.post(
            "/v1/push",
            content=b'{"to": ["a"], "content": NaN}',
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert resp.status_code == 422
        assert resp.json()["detail"][0]["field"] == "content"
        # A number past a double's range is read as Infinity: said as that, not as NaN.
        resp = await http.post(
            "/v1/push",
            content=b'{"to": ["a"], "content": [1e999]}',
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert resp.status_code == 422
        assert "past a double's range (1e999)" in resp.json()["detail"][0]["message"]


@pytest.mark.parametrize("path", ["/v1/push", "/v1/push/batch", "/v1/multicast", "/v1/broadcast"])
async def test_a_body_that_is_no_json_text_is_400_saying_why(api: Api, path: str) -> None:
    """Not UTF-8, or nested past what the JSON parser takes: 400 `bad_request`, saying
    which (it said "There was an error parsing the body" for both)."""
    headers = {**AUTH, "Content-Type": "application/json"}
    async with api() as http:
        resp = await http.post(path, content=b'{"content": "caf\xe9"}', headers=headers)
        assert resp.status_code == 400, resp.text
        assert resp.json() == {
            "error": "bad_request",
            "detail": "the body is not UTF-8 (byte 16): JSON text must be",
        }
        resp = await http.post(path, content=b"[" * 2000 + b"]" * 2000, headers=headers)
        assert resp.status_code == 400, resp.text
        assert resp.json() == {
            "error": "bad_request",
            "detail": "the body's JSON is nested too deeply to parse",
        }
        # An integer past Python's 4300 digits (its guard against quadratic parsing).
        resp = await http.post(path, content=b'{"content": ' + b"9" * 4301 + b"}", headers=headers)
        assert resp.status_code == 400, resp.text
        assert resp.json() == {
            "error": "bad_request",
            "detail": "a number in the body has more than 4300 digits: send it as a string",
        }


@pytest.mark.parametrize("path", ["/v1/push", "/v1/push/batch", "/v1/multicast"])
async def test_content_nested_too_deeply_is_422_on_every_path(api: Api, path: str) -> None:
    """254 levels of arrays are content; 255 are refused naming `content`, on the fast
    path as on the route's (they used to differ: a 500 past ~940 levels on one). A body
    too deep for the JSON parser itself is a 4xx too."""
    headers = {**AUTH, "Content-Type": "application/json"}
    async with api() as http:
        for depth, status in ((254, 200), (255, 422), (300, 422), (980, 4)):
            message = b'{"to": ["a"], "content": ' + b"[" * depth + b"]" * depth + b"}"
            body = b'{"messages": [' + message + b"]}" if path.endswith("batch") else message
            resp = await http.post(path, content=body, headers=headers)
            if status == 4:
                assert resp.status_code // 100 == 4 and "error" in resp.json(), resp.text
                continue
            answer = resp.json()["results"][0] if path.endswith("batch") else resp.json()
            got = answer.get("status", resp.status_code)
            if status == 200:
                assert got in (200, 202), resp.text
                continue
            assert got == 422 and answer["error"] == "invalid_request", resp.text[:300]
            [detail] = answer["detail"]
            # From 256 levels the body's validation may find it first, deeper in.
            assert "content" in detail["field"], detail
            assert detail["message"].startswith(
                ("nested too deeply: at most 254 levels", "Recursion error")
            ), detail


async def test_content_too_deep_with_an_idempotency_key_is_422_too(api: Api) -> None:
    """With a key the request is the route's (pydantic checks the body first)."""
    headers = {**AUTH, "Content-Type": "application/json", "Idempotency-Key": "deep"}
    async with api() as http:
        for depth in (255, 300):
            body = b'{"to": ["a"], "content": ' + b"[" * depth + b"]" * depth + b"}"
            headers["Idempotency-Key"] = f"deep-{depth}"
            resp = await http.post("/v1/push", content=body, headers=headers)
            assert resp.status_code == 422 and resp.json()["error"] == "invalid_request"
            assert "content" in resp.json()["detail"][0]["field"]


async def test_oversized_content_is_413_and_not_sent(api: Api, fakes: Fakes) -> None:
    async with api() as http:
        resp = await http.post(
            "/v1/push", json={"to": ["alice"], "content": "x" * (64 * 1024)}, headers=AUTH
        )
        assert resp.status_code == 413
        assert resp.json()["detail"][0]["field"] == "content"
        assert fakes.nothing_sent()
        # Just under the limit once encoded (two quotes) is fine: queued, alice offline.
        ok = await http.post(
            "/v1/push", json={"to": ["alice"], "content": "x" * (64 * 1024 - 2)}, headers=AUTH
        )
        assert ok.status_code == 200
        assert ok.json()["queued"] == ["alice"]


async def test_huge_body_is_413_before_parsing(api: Api) -> None:
    async with api() as http:
        resp = await http.post(
            "/v1/push",
            content=b'{"to":["a"],"content":"' + b"x" * (2 << 20) + b'"}',
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert resp.status_code == 413
        assert resp.json()["error"] == "payload_too_large"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-key-000000000"},
        {"Authorization": API_KEY},
        {"Authorization": "Basic x"},
    ],
)
async def test_missing_or_wrong_api_key_is_401(api: Api, headers: dict[str, str]) -> None:
    async with api() as http:
        for method, path in [
            ("POST", "/v1/push"),
            ("GET", "/v1/gateways"),
            ("GET", "/v1/users/alice/route"),
        ]:
            resp = await http.request(
                method, path, headers=headers, json={"to": ["a"], "content": 1}
            )
            assert resp.status_code == 401, (path, resp.text)
            assert resp.json()["error"] == "unauthorized"
            assert resp.headers["www-authenticate"] == "Bearer"


async def test_healthz_needs_no_key_and_tracks_the_store(api: Api, fakes: Fakes) -> None:
    async with api() as http:
        resp = await http.get("/healthz")
        assert resp.status_code == 200 and resp.json() == {"status": "ok"}
        assert (await http.get("/docs")).status_code == 200
        assert (await http.get("/openapi.json")).json()["paths"]["/v1/push"]
        fakes.redis_answers = False
        assert (await http.get("/healthz")).status_code == 503


async def test_huge_chunked_body_is_413_too(api: Api) -> None:
    async def chunks():  # type: ignore[no-untyped-def]
        yield b'{"to":["a"],"content":"'
        for _ in range(40):
            yield b"x" * 65536
        yield b'"}'

    async with api() as http:
        resp = await http.post(
            "/v1/push", content=chunks(), headers={**AUTH, "Content-Type": "application/json"}
        )
        assert resp.status_code == 413
        assert resp.json()["error"] == "payload_too_large"


@pytest.mark.parametrize(
    ("path", "raw"),
    LONE_SURROGATES,
)
async def test_a_lone_surrogate_in_content_is_422_naming_content(
    api: Api, fakes: Fakes, path: str, raw: bytes
) -> None:
    async with api() as http:
        resp = await http.post(
            path, content=raw, headers={**AUTH, "Content-Type": "application/json"}
        )
        detail = invalid_details(resp)[0]
        assert detail["field"] == "content" and "surrogate" in detail["message"]
        assert fakes.nothing_sent()
        # A whole emoji, escaped as its surrogate pair, is fine.
        ok = await http.post(
            "/v1/push",
            content=b'{"to":["alice"],"content":"\\ud83d\\ude00"}',
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert ok.status_code == 200, ok.text


async def test_large_bodies_only_with_the_key_and_only_where_needed(api: Api) -> None:
    # Valid JSON over the 1 MiB default: padded with whitespace.
    pad = b" " * (2 * MIB)
    multicast = b'{"to":["alice"],"content":1' + pad + b"}"
    users = b'{"users":[{"uid":"alice"}]' + pad + b"}"
    json_type = {"Content-Type": "application/json"}
    async with api() as http:
        resp = await http.post("/v1/multicast", content=multicast, headers={**AUTH, **json_type})
        assert resp.status_code == 202, resp.text
        resp = await http.put("/v1/users", content=users, headers={**AUTH, **json_type})
        assert resp.status_code == 200, resp.text
        # Without the key: 401, not 413 (nothing of the body was looked at).
        resp = await http.post("/v1/multicast", content=multicast, headers=json_type)
        assert resp.status_code == 401 and resp.json()["error"] == "unauthorized"
        # A public path keeps the small default, whoever calls it.
        resp = await http.request("GET", "/v1/dispatch", content=multicast, headers=json_type)
        assert resp.status_code == 413 and resp.json()["error"] == "payload_too_large"
        resp = await http.post("/v1/push", content=multicast, headers={**AUTH, **json_type})
        assert resp.status_code == 413


@pytest.mark.parametrize("root", ["", "/api"])
async def test_under_a_root_path_the_limits_judge_the_routed_path(fakes: Fakes, root: str) -> None:
    """Served under a root_path (uvicorn --root-path, or mounted), the rate limit and the
    per-path body limits hold as at the root. Before, they compared the raw path: nothing
    was rate limited, and a 2-MiB multicast was 413 (the 1 MiB default)."""
    async with serve(fakes, root_path=root, rate_limit="1/s", rate_burst=1) as http:
        codes = []
        for _ in range(3):
            resp = await http.post(
                f"{root}/v1/push", json={"to": ["a"], "content": 1}, headers=AUTH
            )
            codes.append(resp.status_code)
        assert codes == [200, 429, 429]
    multicast = b'{"to":["alice"],"content":1' + b" " * (2 * MIB) + b"}"
    async with serve(fakes, root_path=root) as http:
        headers = {**AUTH, "Content-Type": "application/json"}
        resp = await http.post(f"{root}/v1/multicast", content=multicast, headers=headers)
        assert resp.status_code == 202, resp.text


async def test_a_tag_the_directory_would_refuse_is_422_naming_it_and_nothing_runs(
    api: Api, fakes: Fakes
) -> None:
    """A NUL in an audience tag was 202, and the job then failed on the directory's own
    check; a user's was named `tags[1]`, without the user."""
    async with api() as http:
        for method, path, body, field in (
            (
                "POST",
                "/v1/broadcast",
                {"content": 1, "audience": {"tags_any": ["ok", "a\0b"]}},
                "body.audience.tags_any.1",
            ),
            (
                "POST",
                "/v1/multicast",
                {"content": 1, "audience": {"tags_any": ["a\0b"]}},
                "body.audience.tags_any.0",
            ),
            (
                "PUT",
                "/v1/users",
                {"users": [{"uid": "a"}, {"uid": "b", "tags": ["x", "\0"]}]},
                "body.users.1.tags.1",
            ),
        ):
            resp = await http.request(method, path, json=body, headers=AUTH)
            assert resp.status_code == 422, resp.text
            [detail] = resp.json()["detail"]
            assert detail["field"] == field and "must not contain NUL" in detail["message"]
    assert fakes.nothing_sent()


def live_gateway(gateway_id: str, group_id: str) -> GatewayInfo:
    return GatewayInfo(gateway_id, group_id, f"ws://{gateway_id}/ws", f"{gateway_id}:1", 0, 1)


async def test_with_an_admin_key_each_key_holds_only_its_scope(api: Api, fakes: Fakes) -> None:
    for gw in (live_gateway("gw1", "g1"), live_gateway("gw2", "g1")):
        await fakes.fleet.announce(gw)
    async with api(admin_api_key=ADMIN_KEY) as http:
        # The push key on the admin endpoints: 403 naming the scope (and its variable).
        for method, path, body in [
            ("POST", "/v1/gateways/gw1/drain", None),
            ("PUT", "/v1/users", {"users": [{"uid": "alice"}]}),
            ("DELETE", "/v1/users/alice", None),
        ]:
            resp = await http.request(method, path, json=body, headers=AUTH)
            assert resp.status_code == 403, (path, resp.text)
            assert resp.json()["error"] == "forbidden"
            assert "admin scope" in resp.json()["detail"]
            assert "IMROUTE_ADMIN_API_KEY" in resp.json()["detail"]
            assert 'scope="admin"' in resp.headers["www-authenticate"]
            resp = await http.request(method, path, json=body)
            assert resp.status_code == 401 and "IMROUTE_ADMIN_API_KEY" in resp.json()["detail"]
        # The admin key cannot push (least privilege).
        for method, path, body in [
            ("POST", "/v1/push", {"to": ["alice"], "content": 1}),
            ("POST", "/v1/broadcast", {"content": 1}),
            ("GET", "/v1/gateways", None),
        ]:
            resp = await http.request(method, path, json=body, headers=ADMIN)
            assert resp.status_code == 403, (path, resp.text)
            assert "push scope" in resp.json()["detail"]
        # Each key does what its scope allows.
        assert (await http.get("/v1/gateways", headers=AUTH)).status_code == 200
        resp = await http.put("/v1/users", json={"users": [{"uid": "alice"}]}, headers=ADMIN)
        assert resp.json() == {"upserted": 1}
        assert (await http.delete("/v1/users/alice", headers=ADMIN)).status_code == 204
        resp = await http.post("/v1/gateways/gw1/drain", headers=ADMIN)
        assert resp.status_code == 202, resp.text
        # The schema says which key each operation takes.
        schema = (await http.get("/openapi.json")).json()
        assert schema["paths"]["/v1/gateways/{gateway_id}/drain"]["post"]["security"] == [
            {"AdminKey": []}
        ]
        assert schema["paths"]["/v1/push"]["post"]["security"] == [{"PushKey": []}]


async def test_a_push_is_read_back_by_its_id_and_an_unknown_one_is_404(api: Api) -> None:
    async with api() as http:
        pushed = await http.post("/v1/push", json={"to": ["alice"], "content": 1}, headers=AUTH)
        assert pushed.status_code == 200, pushed.text
        assert pushed.json()["queued"] == ["alice"]  # offline: nobody is connected
        push_id = pushed.json()["push_id"]
        status = (await http.get(f"/v1/pushes/{push_id}", headers=AUTH)).json()
        assert (status["mode"], status["recipients"], status["queued"]) == ("p2p", 1, 1)
        queued = await http.get(f"/v1/pushes/{push_id}/recipients?state=queued", headers=AUTH)
        assert queued.json()["uids"] == ["alice"], queued.text
        bad = await http.get(
            f"/v1/pushes/{push_id}/recipients", params={"state": "lost"}, headers=AUTH
        )
        assert bad.status_code == 422 and "state" in bad.text
        missing = await http.get("/v1/pushes/nope/recipients?state=acked", headers=AUTH)
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
        unknown = await http.get("/v1/pushes/nope", headers=AUTH)
        assert unknown.status_code == 404 and unknown.json()["error"] == "not_found"
        too_long = await http.get(f"/v1/pushes/{'p' * 65}", headers=AUTH)
        assert too_long.status_code == 422, too_long.text


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("/v1/broadcast", {"content": 1}, "is a broadcast"),
        ("/v1/multicast", {"audience": {"tags_any": ["t"]}, "content": 1}, "directory audience"),
    ],
)
async def test_a_counts_only_receipts_listing_is_409_saying_why(
    api: Api, path: str, body: dict[str, Any], said: str
) -> None:
    """Before: "has 0 recipients, more than IMROUTE_RECEIPTS_MAX_RECIPIENTS" (10,000)."""
    async with api() as http:
        sent = await http.post(path, json=body, headers=AUTH)
        assert sent.status_code == 202, sent.text
        push_id = sent.json()["push_id"]
        for _ in range(100):  # its receipt is written as its job starts
            listing = await http.get(f"/v1/pushes/{push_id}/recipients?state=acked", headers=AUTH)
            if listing.status_code != 404:
                break
            await asyncio.sleep(0.02)
    assert listing.status_code == 409, listing.text
    detail = listing.json()["detail"]
    assert said in detail and "counts only" in detail and "has 0 recipients" not in detail


@pytest.mark.parametrize(("value", "problem"), BAD_IDEMPOTENCY_KEYS)
async def test_a_bad_idempotency_key_is_refused_by_name(
    api: Api, fakes: Fakes, value: bytes, problem: str
) -> None:
    async with api() as http:
        for path, body in (
            ("/v1/push", {"to": ["alice"], "content": 1}),
            ("/v1/broadcast", {"content": 1}),
        ):
            resp = await http.post(path, json=body, headers={**AUTH, "Idempotency-Key": value})
            assert resp.status_code == 422, resp.text
            (detail,) = resp.json()["detail"]
            assert detail["field"] == "Idempotency-Key" and problem in detail["message"]
        assert fakes.idempotency.entries == {}
        assert fakes.nothing_sent()


async def test_receipts_off_on_the_given_stores_too(api: Api, fakes: Fakes) -> None:
    async with api(receipts_ttl_s=0) as http:
        pushed = await http.post("/v1/push", json={"to": ["alice"], "content": 1}, headers=AUTH)
        assert pushed.status_code == 200, pushed.text
        assert fakes.receipts.receipts == {}
        status = await http.get(f"/v1/pushes/{pushed.json()['push_id']}", headers=AUTH)
        assert status.status_code == 404
        waiting = await http.post(
            "/v1/push", json={"to": ["alice"], "content": 1, "wait_ack_ms": 100}, headers=AUTH
        )
        assert waiting.status_code == 422 and "receipts are off" in waiting.text


class AnswersKeptLate(MemoryIdempotencyStore):
    """Redis fails the first write of each kept answer (a failover, an outage): each is
    made later, taking `delay_s`; `refused` counts the keys refused."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.refused_keys: set[str] = set()

    @property
    def refused(self) -> int:
        return len(self.refused_keys)

    async def complete(self, scope: str, key: str, token: str, answer: Answer) -> bool:
        if key not in self.refused_keys:
            self.refused_keys.add(key)
            raise RegistryUnavailable("redis: connection refused")
        await asyncio.sleep(self.delay_s)  # the write made later takes a while
        return await super().complete(scope, key, token, answer)


@pytest.mark.parametrize(("maybe_applied", "said"), [
    (False, "Redis unavailable; nothing was sent"),
    (True, "may have taken effect; retry it with the same Idempotency-Key"),
])  # fmt: skip
async def test_a_redis_outage_says_whether_the_request_may_have_taken_effect(
    api: Api, fakes: Fakes, monkeypatch: pytest.MonkeyPatch, maybe_applied: bool, said: str
) -> None:
    """The operator's trial: a broadcast's creation sent to a paused Redis was answered
    503 "nothing was sent", and ran when Redis resumed (a reply lost is not a write lost)."""
    down = RegistryUnavailable("redis did not answer: Timeout reading from socket")
    down.maybe_applied = maybe_applied

    async def create(*_: Any, **__: Any) -> Any:
        raise down

    monkeypatch.setattr(fakes.jobs, "create", create)
    async with api() as http:
        resp = await http.post("/v1/broadcast", json={"content": "x"}, headers=AUTH)
        read = await http.get("/v1/pushes/nope", headers=AUTH)
    assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
    assert said in resp.json()["detail"], resp.text
    assert read.status_code == 404  # a read is not affected


def _said(lines: list[str], what: str) -> int:
    """The occurrences throttled `lines` said, each its count of `what`(s)."""
    found = [re.search(rf"(\d+) {what}\(", line) for line in lines]
    return sum(int(m[1]) if m else 0 for m in found)


def _unavailable(scrape: str, reason: str) -> float:
    prefix = f'imroute_http_unavailable_total{{reason="{reason}"}} '
    [line] = [x for x in scrape.splitlines() if x.startswith(prefix)]
    return float(line.removeprefix(prefix))


async def test_an_outage_counts_every_503_and_logs_one_line(
    api: Api, fakes: Fakes, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each request an outage answers 503 was a line of its own in the log (40 lines for
    40 pushes; an outage at 3000 requests/s, 3000 lines a second), and no metric counted
    them: now one line says how many, and imroute_http_unavailable counts each."""

    async def append(*_: Any, **__: Any) -> Any:
        raise RegistryUnavailable("redis: connection refused")

    monkeypatch.setattr(fakes.recovery, "append_queued_many", append)
    async with api() as http:
        before = _unavailable((await http.get("/metrics")).text, "redis")
        with caplog.at_level(logging.WARNING, logger="push_service.errors"):
            for _ in range(40):
                resp = await http.post("/v1/push", json={"to": ["amy"], "content": 1}, headers=AUTH)
                assert resp.status_code == 503, resp.text
        after = _unavailable((await http.get("/metrics")).text, "redis")
    assert after - before == 40
    # The first at once (unless a test before opened the window), the rest at the end
    # of the window or, as here, when the app stops.
    lines = [r.getMessage() for r in caplog.records if "answer(s) 503" in r.getMessage()]
    assert len(lines) <= 2 and _said(lines, "answer") == 40, lines
    assert "Redis unavailable; nothing was sent (redis: connection refused)" in lines[-1]


async def test_receipts_redis_refuses_cost_one_line_per_ten_seconds(
    api: Api, fakes: Fakes, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Pushes go out while their receipts cannot be written (a Redis Cluster node of
    receipts down): that was a line per push; now one line says how many."""

    async def record_many(*_: Any, **__: Any) -> None:
        raise RegistryUnavailable("redis: connection refused")

    monkeypatch.setattr(fakes.receipts, "record_many", record_many)
    async with api() as http:
        with caplog.at_level(logging.WARNING, logger="push_service.services.pushes"):
            for _ in range(10):
                resp = await http.post("/v1/push", json={"to": ["amy"], "content": 1}, headers=AUTH)
                assert resp.status_code == 200, resp.text
    lines = [r.getMessage() for r in caplog.records if "could not record" in r.getMessage()]
    assert len(lines) <= 2 and _said(lines, "push") == 10, lines


async def test_a_shutdown_keeps_the_answer_whose_first_write_failed() -> None:
    """The push service's shutdown waits for the Idempotency-Key writes it makes later
    (before: nothing awaited them, and a shutdown dropped them)."""
    fakes = Fakes(idempotency=AnswersKeptLate(delay_s=0.3))
    async with serve(fakes) as http:
        resp = await http.post(
            "/v1/broadcast", json={"content": "x"}, headers={**AUTH, "Idempotency-Key": "k1"}
        )
        assert resp.status_code == 202, resp.text
    [entry] = fakes.idempotency.entries.values()
    assert fakes.idempotency.refused == 1 and entry.answer is not None
    assert entry.answer.status == 202


async def test_answers_kept_late_cost_one_line_per_ten_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every keyed request's answer Redis did not take was a line of its own (and each
    background try another); now each kind is counted, one line per 10 s."""
    fakes = Fakes(idempotency=AnswersKeptLate())
    with caplog.at_level(logging.WARNING):
        async with serve(fakes) as http:
            for i in range(10):
                body, keyed = {"to": ["amy"], "content": i}, {**AUTH, "Idempotency-Key": f"k{i}"}
                resp = await http.post("/v1/push", json=body, headers=keyed)
                assert resp.status_code == 200, resp.text
    assert fakes.idempotency.refused == 10
    assert all(e.answer is not None for e in fakes.idempotency.entries.values())  # kept later
    lines = [r.getMessage() for r in caplog.records if "idempotent answer" in r.getMessage()]
    assert len(lines) <= 2 and _said(lines, "idempotent answer") == 10, lines


async def test_without_a_secret_dispatch_is_503_naming_it(api: Api) -> None:
    """The push service checks clients' tokens with IMROUTE_SECRET (its start warns
    when it is missing: tests/unit/test_push_start.py)."""
    async with api(secret=None, api_key="k-no-secret-0123456789") as http:
        resp = await http.get("/v1/dispatch", headers={"Authorization": "Bearer x.y.z"})
    assert resp.status_code == 503, resp.text
    assert "IMROUTE_SECRET" in resp.json()["detail"]
