"""Two uids never share a user's recovery keys: a uid holding a brace and the uid that
is its SHA-1 hex each read only their own inbox and log (real gateway, push API, Redis
and WebSocket clients)."""

from __future__ import annotations

import hashlib

import pytest

from tests.integration.recovery_helpers import ack, acked, gone, open_ws, pushes, reconnect, replay
from tests.integration.stack import contents, nothing_more, one_group, p2p

pytestmark = pytest.mark.integration

BRACED = "bob{corp}"
# What the key schema tagged BRACED's keys with before: the SHA-1 hex of its UTF-8 bytes,
# which is itself a valid uid.
HEXED = hashlib.sha1(BRACED.encode()).hexdigest()


def test_the_two_uids_are_the_ones_of_the_report() -> None:
    assert HEXED == "71c9a76fb93a5cc98216e44101a2ad16c9e56fc4"


async def test_a_braced_uids_offline_push_is_not_read_nor_acked_by_its_sha1_hex(
    redis_url: str, prefix: str
) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        body = await p2p(http, [BRACED], {"text": "for bob only"})
        assert body["queued"] == [BRACED]
        other = await open_ws(gw, HEXED)
        got, end = await replay(other)
        assert got == [] and end["count"] == 0
        await other.close()
        await gone(gw, HEXED)
        # The victim's inbox is whole: read, acked, then empty.
        ws = await open_ws(gw, BRACED)
        got, _ = await replay(ws)
        assert contents(got) == [{"text": "for bob only"}]
        await ack(ws, got[0])
        await acked(gw, 1)
        assert await reconnect(gw, ws, BRACED) == []


async def test_the_sha1_hex_uids_pushes_never_reach_the_braced_uid(
    redis_url: str, prefix: str
) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        await p2p(http, [HEXED], "for the hex user")
        await p2p(http, [BRACED], "for bob")
        ws = await open_ws(gw, BRACED)
        got, _ = await replay(ws)
        assert contents(got) == ["for bob"]
        # Live: bob's next push is numbered in bob's own log, so no gap is filled from
        # the other user's.
        await p2p(http, [HEXED], "hex again")
        await p2p(http, [BRACED], "bob again")
        (frame,) = await pushes(ws, 1)
        assert frame["content"] == "bob again" and "recovered" not in frame
        assert await nothing_more(ws)
        await ws.close()
        other = await open_ws(gw, HEXED)
        got, _ = await replay(other)
        assert contents(got) == ["for the hex user", "hex again"]
        await other.close()
