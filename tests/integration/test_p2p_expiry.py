"""`failed` never means delivered later: every P2P batch expires by the end of the
router's call, and a gateway that gets to it later drops it."""

from __future__ import annotations

import time
from typing import Any

import grpc.aio
import pytest

from shared.clock import SystemClock
from shared.proto import gateway_pb2
from socket_gateway.faults import DelayCalls, _UnaryInterceptor
from tests.integration.stack import AUTH, api, client, gateway, nothing_more, recv_json

pytestmark = pytest.mark.integration


async def test_a_push_reported_failed_is_never_written_by_a_gateway_that_gets_to_it_later(
    redis_url: str, prefix: str
) -> None:
    busy = DelayCalls(0.0)  # the gateway takes each call up this long after it came
    seen = Record()
    async with (
        gateway(redis_url, prefix, "gw1", "g1", interceptors=[seen, busy]) as gw,
        api(redis_url, prefix, deliver_timeout_s=0.5, deliver_retries=0) as http,
        client(gw, "zoe") as ws,
    ):
        body = {"to": ["zoe"], "content": 1, "store": False}
        ok = await http.post("/v1/push", json=body, headers=AUTH)
        assert ok.json()["delivered"] == ["zoe"], ok.text
        assert (await recv_json(ws))["content"] == 1

        busy.seconds = 0.8
        for content, ttl in ((2, None), (3, 60)):  # without a ttl_s, and with one
            started = time.monotonic()
            sent_ms = SystemClock().now_ms()
            body = {"to": ["zoe"], "content": content, "store": False}
            if ttl:
                body["ttl_s"] = ttl
            out = (await http.post("/v1/push", json=body, headers=AUTH)).json()
            assert out["failed"] == ["zoe"], out
            assert time.monotonic() - started < 0.8
            # The gateway gets to the call after the caller was told `failed`: it must
            # not write it.
            assert await nothing_more(ws, 0.6), "a push reported failed was delivered"
            # Whatever cancels the late call, the batch itself says when it stops being
            # deliverable: the end of the router's call (0.5 s), with or without a ttl_s.
            batch = seen.batches[-1]
            assert sent_ms < batch.expires_ms <= sent_ms + 500, batch.expires_ms - sent_ms

        busy.seconds = 0.0
        body = {"to": ["zoe"], "content": 4, "store": False}
        again = await http.post("/v1/push", json=body, headers=AUTH)
        assert again.json()["delivered"] == ["zoe"], again.text
        assert (await recv_json(ws))["content"] == 4


class Record(_UnaryInterceptor):
    """Keeps every Deliver request the gateway receives."""

    def __init__(self) -> None:
        self.batches: list[gateway_pb2.Batch] = []

    async def around(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any], inner: Any
    ) -> Any:
        if isinstance(request, gateway_pb2.Batch):
            self.batches.append(request)
        else:
            self.batches.extend(request.batches)
        return await inner(request, context)
