"""The seam of a move between groups: a multicast resolved to a user's old route, on a
gateway of the group the client just left, reaches it once.

On a fleet, killing the only gateway of a group left its routes live until they or the
gateway's fleet record lapsed; a multicast resolved meanwhile went to that group's log
after the moved client's replay had read it, and no gateway of its new group brought it
(3 of 400 lost). Here the moment is built exactly: the client resumes on a gateway of
another group, and a multicast is resolved while Redis holds only its old route.
"""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared.keys import KeySchema
from tests.integration.recovery_helpers import ack, connected, gone, open_ws, pushes, replay
from tests.integration.stack import fanout, nothing_more, two_groups

pytestmark = pytest.mark.integration


async def test_a_multicast_resolved_to_the_old_route_reaches_the_moved_client_once(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    route = KeySchema(prefix).route("amy")
    async with two_groups(redis_url, prefix) as (gw1, gw2, http):
        ws = await connected(gw2, "amy")
        await fanout(http, "/v1/multicast", {"to": ["amy"], "content": "in g2"})
        (first,) = await pushes(ws, 1)
        assert first["content"] == "in g2"
        old_route = await redis.hgetall(route)  # gw2's, with a deadline ahead
        await ws.close()
        await gone(gw2, "amy")

        moved = await open_ws(gw1, "amy", first["pos"])
        got, end = await replay(moved)
        assert got == [] and end["complete"] is True
        # Redis now holds the old route only, as when the client's new route was not
        # written yet and the dead gateway's had not lapsed: the multicast goes to g2.
        new_route = await redis.hgetall(route)
        await redis.delete(route)
        await redis.hset(route, mapping=old_route)
        await fanout(http, "/v1/multicast", {"to": ["amy"], "content": "resolved to g2"})
        await redis.delete(route)
        await redis.hset(route, mapping=new_route)
        assert gw2.deliver_service.delivered == 1  # gw2 holds no amy: only the first

        (late,) = await pushes(moved, 1, timeout=5.0)
        assert late["content"] == "resolved to g2"
        assert await nothing_more(moved, 1.0)  # once
        assert gw1.resumer is not None and gw1.resumer.moved_tail_writes == 1
        # Both routes live (resolved while the old one had not lapsed, the new one
        # written): the multicast goes to both groups, and amy gets it once, through g1.
        await redis.hset(route, mapping=old_route)
        await fanout(http, "/v1/multicast", {"to": ["amy"], "content": "to both"})
        await redis.delete(route)
        await redis.hset(route, mapping=new_route)
        (both,) = await pushes(moved, 1)
        assert both["content"] == "to both"
        await ack(moved, both)  # as the SDKs do at once: the gateway forgets it was sent
        assert await nothing_more(moved, 2.5)  # the tail read g2's copy and left it
        assert gw1.resumer.moved_tail_writes == 1
        # Pushes after the move come through its new group, as ever.
        await fanout(http, "/v1/multicast", {"to": ["amy"], "content": "in g1"})
        (after,) = await pushes(moved, 1)
        assert after["content"] == "in g1"
        await moved.close()
    # The move's tail may still be waiting to read again: the gateway's shutdown stops
    # it rather than leaving it to wake up after the gateway is gone.
    assert gw1.resumer is not None and not gw1.resumer._gaps
