"""Two gateways with one id: the second refuses to start, naming the first, while a
gateway restarted under its own id starts as before. Real gateways on real Redis."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from router.fleet.store import RedisGatewayFleet
from shared.clock import SystemClock
from shared.errors import ConfigError
from shared.keys import KeySchema
from shared.models import GatewayInfo
from tests.integration.stack import gateway

pytestmark = pytest.mark.integration


async def test_a_second_gateway_with_a_live_id_refuses_to_start(
    redis_url: str, prefix: str
) -> None:
    async with gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=0.2) as first:
        started = time.monotonic()
        with pytest.raises(ConfigError) as refused:
            async with gateway(redis_url, prefix, "gw1", "g2", heartbeat_s=0.2):
                pass
        message = str(refused.value)
        assert "IMROUTE_GATEWAY_ID: gw1 is already live at" in message
        assert first.info.grpc_address in message
        assert time.monotonic() - started < 2.0
        assert first.fleet is not None
        info, _ = await first.fleet.record("gw1")
        assert info is not None and info.grpc_address == first.info.grpc_address  # untouched
    # Stopped (its record withdrawn): the id is free at once, at any address.
    async with gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=0.2) as again:
        assert again.info.grpc_address != first.info.grpc_address


async def test_a_dead_gateways_record_is_waited_out_not_refused(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    # What a SIGKILLed gateway leaves: a record nobody renews, at an address now unused.
    clock = SystemClock()
    fleet = RedisGatewayFleet(redis, KeySchema(prefix), clock, ttl_s=1.0)  # type: ignore[arg-type]
    await fleet.announce(GatewayInfo("gw1", "g1", "ws://x/ws", "127.0.0.1:1", 0, clock.now_ms()))
    started = time.monotonic()
    async with gateway(redis_url, prefix, "gw1", "g1") as gw:
        waited = time.monotonic() - started
        assert 0.5 < waited < 3.0, waited  # until the record lapsed, about 1 s
        assert gw.fleet is not None
        info, _ = await gw.fleet.record("gw1")
        assert info is not None and info.grpc_address == gw.info.grpc_address
