"""P2PPusher's reactions to failures (pure: fake registry, fleet and gateway client).

A failure that suggests a gateway is gone (UNAVAILABLE) makes the next push re-read the
fleet; a refusal by an open circuit, an expired push or an answered error do not."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from router.gateway_rpc.client import CIRCUIT_OPEN, CoalescingGatewayClient
from router.p2p.plan import Outgoing, PushOutcome
from router.p2p.pusher import CLOCK_MARGIN_MS, P2PPusher, deliver_expiry_ms
from router.testing import FakeGatewayClient
from router.testing.routes import OneRoute, OneRouteFleet
from shared.errors import RegistryUnavailable
from shared.models import GatewayInfo, Message, Route

# Old enough for a re-read of the fleet to be allowed.
OLD_S = 10.0


MESSAGE = Message("m1", "p1", 0, "admin", b'"hi"', 0)


async def push(pusher: P2PPusher, uids: list[str], store: bool = True) -> PushOutcome:
    """MESSAGE pushed to `uids`: a batch of one."""
    [outcome] = await pusher.push([Outgoing(MESSAGE, uids, store=store)])
    assert isinstance(outcome, PushOutcome), outcome
    return outcome


@pytest.mark.parametrize(
    ("client", "rereads"),
    [
        (FakeGatewayClient(fail="UNAVAILABLE"), 1),
        (FakeGatewayClient(fail=CIRCUIT_OPEN), 0),
        (FakeGatewayClient(fail="DEADLINE_EXCEEDED"), 0),
        (FakeGatewayClient(fail="INTERNAL"), 0),
        (FakeGatewayClient(expired=True), 0),
    ],
    ids=["unavailable", "circuit-open", "deadline", "internal", "expired"],
)
async def test_only_a_gateway_that_may_be_gone_makes_the_fleet_reread(
    client: FakeGatewayClient, rereads: int
) -> None:
    fleet = OneRouteFleet(OLD_S)
    pusher = P2PPusher(OneRoute(), fleet, CoalescingGatewayClient(client), 1.0)  # type: ignore[arg-type]
    outcome = await push(pusher, ["amy"])
    assert outcome.failed == ["amy"] and outcome.delivered == []
    assert fleet.invalidated == rereads


class Log:
    """An in-memory recovery log: seqs per user, and what the inbox was asked."""

    def __init__(self) -> None:
        self.queued: list[dict[str, int]] = []
        self.acked: list[tuple[str, int]] = []

    async def append_queued(
        self, message: Message, uids: Sequence[str], expires_ms: int
    ) -> tuple[list[int], int]:
        # Logged and queued at once: every stored message waits in the inbox for an ack.
        self.queued.append({u: 7 for u in uids})
        return [7 for _ in uids], 0

    async def append_queued_many(
        self, items: Sequence[tuple[Message, Sequence[str], int]]
    ) -> list[tuple[list[int], int]]:
        return [await self.append_queued(*item) for item in items]

    async def ack(self, wanted: Sequence[tuple[str, int]]) -> list[None]:
        self.acked.extend(wanted)
        return [None] * len(wanted)


async def test_a_failed_push_is_queued_then_retried_until_it_reaches_the_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("router.p2p.pusher.RETRY_AFTER_S", (0.01, 0.01, 0.01))
    client = FakeGatewayClient("UNAVAILABLE", "UNAVAILABLE")  # two calls fail
    log = Log()
    pusher = P2PPusher(OneRoute(), OneRouteFleet(OLD_S), CoalescingGatewayClient(client), 1.0, log)  # type: ignore[arg-type]
    outcome = await push(pusher, ["amy"])
    assert outcome.failed == ["amy"] and outcome.queued == ["amy"]
    assert log.queued == [{"amy": 7}]
    for _ in range(100):
        if pusher.retried:
            break
        await asyncio.sleep(0.01)
    # Reached, it stays in the inbox until amy's device acks it (the gateway's part).
    assert pusher.retried == 1 and log.acked == []
    assert len(client.calls) == 3  # the push, a failed retry, the one that reached it
    await pusher.aclose()


async def test_past_the_cap_on_retries_a_failed_push_is_counted_and_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("router.p2p.pusher.MAX_RETRYING", 1)
    monkeypatch.setattr("router.p2p.pusher.RETRY_AFTER_S", (60.0,))
    client = FakeGatewayClient("UNAVAILABLE", "UNAVAILABLE", "UNAVAILABLE")
    pusher = P2PPusher(
        OneRoute(), OneRouteFleet(OLD_S), CoalescingGatewayClient(client), 1.0, Log()
    )  # type: ignore[arg-type]
    assert (await push(pusher, ["amy"])).queued == ["amy"]  # retried in the background
    assert pusher.not_retried.total == 0
    with caplog.at_level("WARNING", "router.p2p.pusher"):
        for _ in range(2):
            assert (await push(pusher, ["amy"])).queued == ["amy"]
    assert pusher.not_retried.total == 2
    [line] = [r.getMessage() for r in caplog.records if "not retried" in r.getMessage()]
    assert line.startswith("1 recipient(s) of failed P2P pushes not retried")
    await pusher.aclose()


async def test_recipients_the_retries_give_up_on_are_counted_and_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: a retry that ran out of tries (a gateway cut off for a minute, its
    clients connected all along) ended quietly, counted nowhere; so did one the
    service's stop cancelled."""
    monkeypatch.setattr("router.p2p.pusher.RETRY_AFTER_S", (0.01, 0.01))
    client = FakeGatewayClient(fail="UNAVAILABLE")
    pusher = P2PPusher(
        OneRoute(), OneRouteFleet(OLD_S), CoalescingGatewayClient(client), 1.0, Log()
    )  # type: ignore[arg-type]
    with caplog.at_level("WARNING", "router.p2p.pusher"):
        assert (await push(pusher, ["amy"])).queued == ["amy"]
        for _ in range(100):
            if pusher.given_up.total:
                break
            await asyncio.sleep(0.01)
        assert pusher.given_up.total == 1 and len(client.calls) == 3  # the push, 2 tries
        monkeypatch.setattr("router.p2p.pusher.RETRY_AFTER_S", (60.0,))
        assert (await push(pusher, ["amy"])).failed == ["amy"]
        await pusher.aclose()  # the stop cancels this retry before it started
    assert pusher.given_up.total == 2 and pusher.retried == 0
    lines = [r.getMessage() for r in caplog.records if "no longer retried" in r.getMessage()]
    assert lines[0].startswith("1 recipient(s) of failed P2P pushes no longer retried in the "
                               "background (their gateways failed for 0 s)"), lines  # fmt: skip
    assert "(1 in all)" in lines[0]
    # Said within its window's line, or at its end: held back here (no 10 s passed).
    assert len(lines) == 1


async def test_store_false_neither_logs_nor_queues() -> None:
    log = Log()
    pusher = P2PPusher(
        OneRoute(),
        OneRouteFleet(OLD_S),
        CoalescingGatewayClient(FakeGatewayClient(fail="UNAVAILABLE")),
        1.0,
        log,
    )  # type: ignore[arg-type]
    outcome = await push(pusher, ["amy", "bob"], store=False)
    assert outcome.failed == ["amy"] and outcome.offline == ["bob"] and outcome.queued == []
    assert log.queued == []


def test_every_p2p_batch_expires_by_the_end_of_its_call() -> None:
    now = 1_000_000
    assert deliver_expiry_ms(0, now, 2.0) == now + 2000 - CLOCK_MARGIN_MS  # no ttl_s
    assert deliver_expiry_ms(now + 500, now, 2.0) == now + 500  # the ttl_s comes first
    assert deliver_expiry_ms(now + 60_000, now, 2.0) == now + 2000 - CLOCK_MARGIN_MS
    assert deliver_expiry_ms(0, now, 0.2) == now + 150  # short calls keep 3/4 of their time


class FlakyRoutes(OneRoute):
    """amy's route (when `online`), behind look-ups (counted from 1) of which those
    numbered in `failing` fail."""

    def __init__(self, *failing: int, online: bool = True) -> None:
        self.failing = set(failing)
        self.online = online
        self.lookups = 0

    async def lookup(self, uids: Sequence[str]) -> dict[str, list[Route]]:
        self.lookups += 1
        if self.lookups in self.failing:
            raise RegistryUnavailable("redis did not answer: connection reset")
        return await super().lookup(uids) if self.online else {}


async def test_a_look_up_that_fails_after_the_push_is_logged_leaves_it_queued_and_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The push is in amy's log and inbox: not "nothing was sent" (503), but failed for
    now, queued, and delivered by the background retry once her route can be read."""
    monkeypatch.setattr("router.p2p.pusher.RETRY_AFTER_S", (0.01, 0.01))
    client, log, routes = FakeGatewayClient(), Log(), FlakyRoutes(1)
    pusher = P2PPusher(routes, OneRouteFleet(OLD_S), CoalescingGatewayClient(client), 1.0, log)  # type: ignore[arg-type]
    outcome = await push(pusher, ["amy"])
    assert (outcome.delivered, outcome.failed, outcome.queued) == ([], ["amy"], ["amy"])
    [error] = outcome.errors
    assert error.error is not None and error.error.startswith("route look-up failed: ")
    assert outcome.positions == {"amy": 7} and log.queued == [{"amy": 7}]
    for _ in range(100):
        if pusher.retried:
            break
        await asyncio.sleep(0.01)
    assert pusher.retried == 1 and len(client.calls) == 1
    await pusher.aclose()


async def test_a_batch_whose_look_up_fails_fails_only_what_was_not_logged() -> None:
    routes = FlakyRoutes(1)
    pusher = P2PPusher(
        routes, OneRouteFleet(OLD_S), CoalescingGatewayClient(FakeGatewayClient()), 1.0, Log()
    )  # type: ignore[arg-type]
    stored, at_most_once = await pusher.push(
        [Outgoing(MESSAGE, ["amy"]), Outgoing(MESSAGE, ["amy"], store=False)]
    )
    assert isinstance(stored, PushOutcome) and stored.queued == ["amy"]
    assert isinstance(at_most_once, RegistryUnavailable)
    await pusher.aclose()


async def test_when_nothing_could_be_logged_the_look_ups_error_is_the_answer() -> None:
    class Down(Log):
        async def append_queued(
            self, message: Message, uids: Sequence[str], expires_ms: int
        ) -> tuple[list[int], int]:
            raise RegistryUnavailable("redis did not answer: connection refused")

    pusher = P2PPusher(
        FlakyRoutes(1),
        OneRouteFleet(OLD_S),
        CoalescingGatewayClient(FakeGatewayClient()),
        1.0,
        Down(),
    )  # type: ignore[arg-type]
    with pytest.raises(RegistryUnavailable):
        await pusher.push([Outgoing(MESSAGE, ["amy"])])


async def test_a_failed_second_look_up_leaves_the_answer_as_it_was() -> None:
    """amy is offline: the push is queued, and the look-up for a client that connected
    meanwhile fails: the answer is still "queued", not an error for a logged push."""
    routes = FlakyRoutes(2, online=False)  # the first look-up answers, the second fails
    pusher = P2PPusher(
        routes, OneRouteFleet(OLD_S), CoalescingGatewayClient(FakeGatewayClient()), 1.0, Log()
    )  # type: ignore[arg-type]
    outcome = await push(pusher, ["amy"])
    assert (outcome.offline, outcome.queued) == (["amy"], ["amy"])
    assert routes.lookups == 2
    assert pusher.after_answer_failed.total == 1  # counted, and said at most once per 10 s
    await pusher.aclose()


async def test_a_fleet_that_cannot_be_read_after_the_log_write_leaves_the_push_queued() -> None:
    """The gateways' addresses are read after the push is logged: their read failing
    makes it failed and queued (tried again), not a 503; unlogged (`store: false`), the
    error is the answer, as nothing was sent."""

    class Unreadable(OneRouteFleet):
        async def live(self) -> list[GatewayInfo]:
            raise RegistryUnavailable("redis did not answer: connection reset")

    pusher = P2PPusher(
        OneRoute(), Unreadable(OLD_S), CoalescingGatewayClient(FakeGatewayClient()), 1.0, Log()
    )  # type: ignore[arg-type]
    outcome = await push(pusher, ["amy"])
    assert (outcome.delivered, outcome.failed, outcome.queued) == ([], ["amy"], ["amy"])
    stored, unlogged = await pusher.push(
        [Outgoing(MESSAGE, ["amy"]), Outgoing(MESSAGE, ["amy"], store=False)]
    )
    assert isinstance(stored, PushOutcome) and stored.queued == ["amy"]
    assert isinstance(unlogged, RegistryUnavailable)
    with pytest.raises(RegistryUnavailable):
        await pusher.push([Outgoing(MESSAGE, ["amy"], store=False)])
    await pusher.aclose()
