"""OpenTelemetry traces across real processes: a push service and two gateway
processes, each exporting over OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT) to a real
receiver in this test, with real WebSocket clients that ack.

A multicast's trace: the caller's context continued by the request's span, the job,
a look-up per chunk, a publish per batch with its attempts, each gateway's delivery of
its group's batch under that publish, and each gateway's acks under its delivery; no
span per recipient. A P2P push's: the look-up, one call per gateway, each gateway's
delivery under its call, the acks waited for as an event. Off, nothing is sent.
(An in-memory exporter cannot see into other processes, so the processes export for
real here; tests/unit/test_tracing.py uses the SDK's InMemorySpanExporter in-process.)
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection

from tests.integration.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver
from tests.integration.stack import AUTH, recv_json
from tests.integration.traces import GATEWAYS, USERS, clients, processes

pytestmark = pytest.mark.integration


async def push_and_ack(ws: ClientConnection) -> dict[str, Any]:
    """The next push frame, acked as the SDKs do."""
    frame = await recv_json(ws, timeout=10)
    assert frame["type"] == "push", frame
    await ws.send(json.dumps({"type": "ack", "pos": frame["pos"]}))
    return frame


def one(spans: list[ReceivedSpan], name: str, **attrs: Any) -> ReceivedSpan:
    found = [
        s
        for s in spans
        if s.name == name and all(s.attributes.get(k) == v for k, v in attrs.items())
    ]
    assert len(found) == 1, (name, attrs, [(s.name, s.attributes) for s in spans])
    return found[0]


def traced_env(receiver: Receiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: the test need not wait 5 s for spans
    }


async def test_a_multicast_is_one_trace_across_the_push_service_and_both_gateways(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    with (
        otlp_receiver() as receiver,
        processes(redis_url, prefix, tmp_path, traced_env(receiver)) as stack,
    ):
        async with httpx.AsyncClient(timeout=30) as http, clients(stack, http) as sockets:
            resp = await http.post(
                f"{stack.api}/v1/multicast",
                json={"to": [*USERS, "nobody"], "content": {"hi": 1}},
                headers={**AUTH, "traceparent": f"00-{caller_trace}-{caller_span}-01"},
            )
            assert resp.status_code == 202, resp.text
            push_id = resp.json()["push_id"]
            frames = await asyncio.gather(*(push_and_ack(ws) for ws in sockets.values()))
            assert {f["push_id"] for f in frames} == {push_id}

            def complete(spans: list[ReceivedSpan]) -> bool:
                acks = {s.instance for s in spans if s.name == "gateway.acks"}
                jobs = [s for s in spans if s.name == "push.job"]
                return acks == set(GATEWAYS) and bool(jobs)

            spans = await asyncio.to_thread(receiver.wait_for, complete)

    # One trace: the caller's, continued.
    assert {s.trace_id for s in spans} == {caller_trace}, {s.trace_id for s in spans}
    root = one(spans, "POST /v1/multicast")
    assert (root.kind, root.parent_id, root.service) == (
        "SERVER",
        caller_span,
        "imroute-push-service",
    )
    assert root.attributes["imroute.push_id"] == push_id
    assert root.attributes["http.response.status_code"] == 202
    job = one(spans, "push.job")
    assert job.parent_id == root.span_id
    assert (job.attributes["imroute.batches"], job.attributes["imroute.published"]) == (2, 2)
    assert job.attributes["imroute.offline"] == 1
    lookup = one(spans, "routes.lookup")
    assert lookup.parent_id == job.span_id and lookup.attributes["imroute.recipients"] == 5
    # A publish per batch (one per group), each with its attempt, under the job.
    for gw, group in GATEWAYS.items():
        publish = one(spans, "bus.publish", **{"imroute.topic": f"group.{group}"})
        assert (publish.kind, publish.parent_id) == ("PRODUCER", job.span_id)
        assert publish.attributes["imroute.recipients"] == 2
        attempt = one([s for s in spans if s.parent_id == publish.span_id], "bus.attempt")
        assert attempt.attributes["imroute.outcome"] == "ok"
        assert attempt.attributes["imroute.attempt"] == 0
        # That gateway's delivery, in its own process, under the publish.
        (deliver,) = [s for s in spans if s.name == "gateway.deliver" and s.instance == gw]
        assert deliver.service == "imroute-gateway"
        assert (deliver.kind, deliver.parent_id) == ("CONSUMER", publish.span_id)
        assert deliver.attributes["imroute.batch_id"] == publish.attributes["imroute.batch_id"]
        assert (deliver.attributes["imroute.written"], deliver.attributes["imroute.missing"]) == (
            2,
            0,
        )
        acks = [s for s in spans if s.name == "gateway.acks" and s.instance == gw]
        assert all(s.parent_id == deliver.span_id for s in acks)
        assert sum(s.attributes["imroute.acked"] for s in acks) == 2
    # Spans per batch and per gateway, never per recipient: 4 recipients, 2 batches.
    named = sorted(s.name for s in spans if s.name != "gateway.acks")
    assert named == sorted(
        ["POST /v1/multicast", "push.job", "routes.lookup"]
        + ["bus.publish", "bus.attempt", "gateway.deliver"] * 2
    ), named


async def test_a_p2p_push_traces_each_gateway_call_and_its_delivery(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    with (
        otlp_receiver() as receiver,
        processes(redis_url, prefix, tmp_path, traced_env(receiver)) as stack,
    ):
        async with httpx.AsyncClient(timeout=30) as http, clients(stack, http) as sockets:
            sent = asyncio.ensure_future(
                http.post(
                    f"{stack.api}/v1/push",
                    json={"to": ["a1", "b1"], "content": "x", "wait_ack_ms": 5000},
                    headers=AUTH,
                )
            )
            await asyncio.gather(push_and_ack(sockets["a1"]), push_and_ack(sockets["b1"]))
            answer = (await sent).json()
            assert sorted(answer["acked"]) == ["a1", "b1"], answer

            # And a batch: one call per gateway for its messages, a delivery per message.
            batch = await http.post(
                f"{stack.api}/v1/push/batch",
                json={"messages": [{"to": [uid], "content": uid} for uid in ("a2", "b2", "a2")]},
                headers=AUTH,
            )
            assert [r["status"] for r in batch.json()["results"]] == [200] * 3, batch.text

            def complete(spans: list[ReceivedSpan]) -> bool:
                names = [s.name for s in spans]
                return names.count("gateway.deliver") == 5 and "POST /v1/push/batch" in names

            spans = await asyncio.to_thread(receiver.wait_for, complete)
        batch_spans = [s for s in spans if s.trace_id == one(spans, "POST /v1/push/batch").trace_id]
        spans = [s for s in spans if s not in batch_spans]

    root = one(spans, "POST /v1/push")
    assert (root.kind, root.parent_id) == ("SERVER", "")  # no caller context: a new trace
    assert {s.trace_id for s in spans if s.name != "gateway.acks"} == {root.trace_id}
    assert root.attributes["imroute.push_id"] == answer["push_id"]
    assert root.attributes["imroute.delivered"] == 2
    assert ("acks", {"imroute.acked": 2, "imroute.unacked": 0}) in root.events
    lookup = one(spans, "routes.lookup")
    assert lookup.parent_id == root.span_id and lookup.attributes["imroute.routes"] == 2
    for gw in ("gwa", "gwb"):
        call = one(spans, "gateway.call", **{"imroute.gateway_id": gw})
        assert (call.kind, call.parent_id) == ("CLIENT", root.span_id)
        assert (call.attributes["imroute.delivered"], call.attributes["imroute.missing"]) == (1, 0)
        (deliver,) = [s for s in spans if s.name == "gateway.deliver" and s.instance == gw]
        assert (deliver.kind, deliver.parent_id) == ("SERVER", call.span_id)
        assert deliver.attributes["imroute.written"] == 1
    # The batch's trace: its look-up once, a call per gateway, each message's delivery.
    root = one(batch_spans, "POST /v1/push/batch")
    assert root.attributes["imroute.messages"] == 3
    assert one(batch_spans, "routes.lookup").parent_id == root.span_id
    for gw, messages in (("gwa", 2), ("gwb", 1)):
        call = one(batch_spans, "gateway.call", **{"imroute.gateway_id": gw})
        assert call.parent_id == root.span_id
        assert call.attributes.get("imroute.batches", 1) == messages
        delivered = [s for s in batch_spans if s.parent_id == call.span_id]
        assert [s.name for s in delivered] == ["gateway.deliver"] * messages
        assert {s.instance for s in delivered} == {gw}


async def test_off_nothing_is_sent_and_pushes_go_on(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """Without OTEL_EXPORTER_OTLP_ENDPOINT no process exports, even for a request that
    carries a traceparent. (The receiver is there; nobody is told of it.)"""
    with otlp_receiver() as receiver, processes(redis_url, prefix, tmp_path, {}) as stack:
        async with httpx.AsyncClient(timeout=30) as http, clients(stack, http) as sockets:
            resp = await http.post(
                f"{stack.api}/v1/push",
                json={"to": ["a1"], "content": 1},
                headers={
                    **AUTH,
                    "traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01",
                },
            )
            assert resp.json()["delivered"] == ["a1"], resp.text
            assert (await recv_json(sockets["a1"]))["content"] == 1
            await asyncio.sleep(1.0)  # past any batch delay an exporter would have had
    assert (receiver.requests, receiver.spans) == (0, [])
