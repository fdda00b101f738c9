"""Drain requests, on the in-memory double and on real Redis (standalone and Cluster):
taken once per boot, and a taken request still counts until it lapses, so the last
gateway of a group cannot be asked to drain while another is between taking its
request and announcing that it drains."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from router.fleet.base import DrainRequests
from router.fleet.drain import RedisDrainRequests
from router.redis.client import connect_redis
from router.testing.routes import MemoryDrainRequests
from shared.keys import KeySchema

pytestmark = pytest.mark.integration


@pytest.fixture(params=["memory", "standalone", "cluster"])
async def drains(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[DrainRequests]:
    if request.param == "memory":
        yield MemoryDrainRequests()
        return
    name = "cluster_url" if request.param == "cluster" else "redis_url"
    async with connect_redis(request.getfixturevalue(name)) as client:
        yield RedisDrainRequests(client, KeySchema(prefix))


async def test_a_request_is_taken_once_and_only_by_its_boot(drains: DrainRequests) -> None:
    await drains.request("gw1", 100)
    assert not await drains.take("gw1", 99)  # another boot: dropped
    assert not await drains.take("gw1", 100)
    await drains.request("gw1", 100)
    assert await drains.take("gw1", 100)
    assert not await drains.take("gw1", 100)  # once
    await drains.request("gw1", 100)  # asked again: taken again
    assert await drains.take("gw1", 100)


async def test_a_taken_request_still_counts_against_draining_the_last(
    drains: DrainRequests,
) -> None:
    assert await drains.request_unless_last("gw1", 100, {"gw2": 200})
    # gw1 took it, and has not announced yet that it drains: gw2 is still the last.
    assert await drains.take("gw1", 100)
    assert not await drains.request_unless_last("gw2", 200, {"gw1": 100})
    assert not await drains.take("gw2", 200)  # nothing was asked of it
    # A gateway that restarted (another boot) is not draining: gw2 may be asked.
    assert await drains.request_unless_last("gw2", 200, {"gw1": 101})
