"""Hedged publishing over real gRPC: the real google-cloud-pubsub async client against a
Publisher server whose latency and errors each test chooses; and a hedged duplicate
reaching a real client once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import grpc
import httpx
import pytest
import redis.asyncio as aioredis

from router.bus import BROADCAST
from router.bus.base import NEXT_SEQ, SEQ
from router.bus.pubsub import PubSubBus
from router.hedging import HedgingSettings, RetrySettings
from router.hedging.metrics import PublishMetrics
from router.testing.pubsub import Behaviour, Call, LatencyPublisher
from shared.clock import SystemClock
from shared.errors import BusUnavailable, ConfigError
from tests.integration.group_pushes import connect_all, frames
from tests.integration.stack import api, gateway, settings
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

FAST = 0.005
RETRY = RetrySettings(initial_rpc_timeout_s=5, total_timeout_s=10, initial_backoff_s=0.05)


@pytest.fixture
async def server() -> AsyncIterator[LatencyPublisher]:
    async with LatencyPublisher() as s:
        yield s


def bus_for(server: LatencyPublisher, hedging: HedgingSettings | None, **kw: object) -> PubSubBus:
    return PubSubBus(
        "imroute-test",
        "hedge:",
        endpoint=server.address,
        hedging=hedging,
        retry=kw.pop("retry", RETRY),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


async def earn_tokens(bus: PubSubBus, server: LatencyPublisher, n: int) -> None:
    """Fast, successful publishes until the topic's bucket holds `n` tokens."""
    hedging = bus.hedger.hedging
    assert hedging is not None
    server.plan = lambda call: Behaviour(FAST)
    for _ in range(round(n / hedging.refill_ratio)):
        await bus.publish(BROADCAST, b"warm-up")
    bucket = bus.hedger.bucket(BROADCAST)
    assert bucket is not None and bucket.tokens == n
    server.calls.clear()


def slow_first(seconds: float) -> Callable[[Call], Behaviour]:
    """The first call of a publish (attempt 0) is slow; hedges are fast."""
    return lambda call: Behaviour(seconds if call.hedged_attempt_count == 0 else FAST)


async def test_a_slow_first_attempt_is_beaten_by_a_hedge_which_cancels_it(
    server: LatencyPublisher,
) -> None:
    async with bus_for(server, HedgingSettings(0.1, 50, 0.2)) as bus:
        await earn_tokens(bus, server, 1)
        server.plan = slow_first(3.0)
        started = time.monotonic()
        message_id = await bus.publish(BROADCAST, b"batch", {"batch_id": "b1"})
        elapsed = time.monotonic() - started
        assert 0.1 <= elapsed < 1.0
        assert server.attempts == [0, 1]
        first, hedge = server.calls
        assert hedge.answered and message_id == hedge.message_id
        assert first.data == hedge.data == [b"batch"]
        # The loser is really cancelled: the server saw the client cancel the call.
        await wait_for(lambda: first.cancelled, "the first attempt cancelled", 3.0)
        assert not first.answered
        assert first.publish_start_ms == hedge.publish_start_ms  # one publish, two attempts
        assert 0.09 <= hedge.started - first.started < 0.5


async def test_no_hedge_when_the_first_attempt_beats_the_delay(server: LatencyPublisher) -> None:
    async with bus_for(server, HedgingSettings(0.2, 50, 0.2)) as bus:
        await earn_tokens(bus, server, 5)
        server.plan = lambda call: Behaviour(0.05)
        for _ in range(10):
            await bus.publish(BROADCAST, b"quick")
        await asyncio.sleep(0.3)  # no late hedge either
        assert server.attempts == [0] * 10


async def test_hedges_repeat_every_delay_until_the_tokens_run_out(
    server: LatencyPublisher,
) -> None:
    async with bus_for(server, HedgingSettings(0.1, 50, 0.2)) as bus:
        await earn_tokens(bus, server, 3)
        server.plan = lambda call: Behaviour(0.8)  # every attempt slow
        await bus.publish(BROADCAST, b"slow")
        assert server.attempts == [0, 1, 2, 3]  # three tokens, three hedges, then none
        # Hedge k goes k delays after the original. Measured where the server took each
        # call, one arrival late makes the next gap short (CI: 0.136 s then 0.067 s):
        # each is read from the first call, so one's jitter does not count twice.
        first = server.calls[0].started
        offsets = [call.started - first for call in server.calls]
        assert all(0.08 * k < t < 0.1 * k + 0.2 for k, t in enumerate(offsets[1:], 1)), offsets
        await wait_for(lambda: sum(c.cancelled for c in server.calls) == 3, "three cancelled", 3.0)


async def test_with_no_tokens_no_hedge_is_sent(server: LatencyPublisher) -> None:
    # The bucket starts empty, as in Google's clients.
    async with bus_for(server, HedgingSettings(0.1, 50, 0.1)) as bus:
        server.plan = lambda call: Behaviour(0.4)
        await bus.publish(BROADCAST, b"first of all")
        assert server.attempts == [0]


async def test_hedged_errors_are_discarded(server: LatencyPublisher) -> None:
    def plan(call: Call) -> Behaviour:
        if call.hedged_attempt_count == 0:
            return Behaviour(0.5)
        return Behaviour(FAST, grpc.StatusCode.UNAVAILABLE)

    async with bus_for(server, HedgingSettings(0.1, 50, 0.2)) as bus:
        await earn_tokens(bus, server, 2)
        server.plan = plan
        message_id = await bus.publish(BROADCAST, b"x")
        assert server.attempts == [0, 1, 2]
        assert message_id == server.calls[0].message_id  # the original's answer


async def test_the_originals_terminal_error_fails_the_publish(server: LatencyPublisher) -> None:
    def plan(call: Call) -> Behaviour:
        if call.hedged_attempt_count == 0:
            return Behaviour(0.25, grpc.StatusCode.INVALID_ARGUMENT)
        return Behaviour(0.1, grpc.StatusCode.UNAVAILABLE)

    async with bus_for(server, HedgingSettings(0.1, 50, 0.2)) as bus:
        await earn_tokens(bus, server, 1)
        server.plan = plan
        with pytest.raises(BusUnavailable, match="INVALID_ARGUMENT") as info:
            await bus.publish(BROADCAST, b"x")
        assert "injected" in str(info.value)
        assert server.attempts == [0, 1]  # not retried: INVALID_ARGUMENT is terminal


async def test_the_original_is_retried_on_retryable_codes_and_hedges_never_are(
    server: LatencyPublisher,
) -> None:
    def plan(call: Call) -> Behaviour:
        if call.index < 2:
            return Behaviour(FAST, grpc.StatusCode.UNAVAILABLE)
        return Behaviour(FAST)

    async with bus_for(server, None) as bus:
        server.plan = plan
        await bus.publish(BROADCAST, b"x")
        assert server.attempts == [0, 0, 0]  # two retries of the original


async def test_metrics_count_attempts_hedges_wins_and_cancellations(
    server: LatencyPublisher,
) -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    async with bus_for(
        server, HedgingSettings(0.1, 50, 0.2), observer=PublishMetrics(registry)
    ) as bus:
        await earn_tokens(bus, server, 1)
        server.plan = slow_first(2.0)
        await bus.publish(BROADCAST, b"x")

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"topic": BROADCAST, **labels})

    assert value("imroute_bus_publish_attempts_total", kind="original") == 6  # 5 + 1
    assert value("imroute_bus_hedges_sent_total") == 1
    assert value("imroute_bus_hedge_wins_total") == 1
    assert value("imroute_bus_cancelled_attempts_total") == 1
    assert value("imroute_bus_hedge_tokens") == pytest.approx(0.2)
    assert value("imroute_bus_publish_seconds_count") == 6


def test_hedging_with_ordering_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="ordering"):
        PubSubBus("imroute-test", hedging=HedgingSettings(), message_ordering=True)


def test_a_hedge_delay_past_the_retry_timeouts_is_refused() -> None:
    with pytest.raises(ValueError, match="initial_rpc_timeout_s"):
        PubSubBus(
            "imroute-test",
            hedging=HedgingSettings(3.0),
            retry=RetrySettings(initial_rpc_timeout_s=2.0),
        )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"hedge_delay_ms": "50"}, "50 ms is outside the allowed range 100 ms to 10 s"),
        ({"hedge_delay_ms": "6000"}, "initial_rpc_timeout_s"),
        ({"hedge_delay_ms": "200", "hedge_max_tokens": 0}, "max_tokens: 0"),
        ({"hedge_delay_ms": "200", "hedge_refill_ratio": 0.5}, "refill_ratio: 0.5"),
        ({"hedge_max_tokens": 10}, "IMROUTE_HEDGE_DELAY_MS"),
    ],
)
def test_bad_hedging_config_stops_the_push_service_naming_it(
    redis_url: str, prefix: str, env: dict[str, object], message: str
) -> None:
    from push_service.app import create_app

    with pytest.raises(ConfigError) as info:
        create_app(settings(redis_url, prefix, **env))
    assert message in str(info.value)


def test_a_hedge_delay_that_is_not_a_number_is_refused(redis_url: str, prefix: str) -> None:
    with pytest.raises(ConfigError, match="IMROUTE_HEDGE_DELAY_MS"):
        settings(redis_url, prefix, hedge_delay_ms="soon")


async def test_a_hedged_publish_reaches_a_client_once(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    # The push service's own hedged bus (Redis Streams, on its Redis: the stream is the
    # topic's log), a real gateway and client. CLIENT PAUSE holds the original publish
    # past the hedge delay, so a hedge follows; when the pause ends both scripts run, and
    # the second finds the batch is the topic's last entry already: one entry, one frame.
    # (Where the two land as two entries, the gateway drops the second by its batch id:
    # test_retry.)
    from contextlib import AsyncExitStack

    from router.bus.redis_streams import stream_key
    from shared.batches import to_batch
    from shared.models import Message
    from shared.proto import gateway_pb2

    def batch(n: int, uids: list[str]) -> bytes:
        message = Message(f"m{n}", f"p{n}", 0, "admin", b'"hedged"', SystemClock().now_ms())
        b = to_batch(message, uids, f"batch-{n}")
        b.mode = gateway_pb2.MODE_MULTICAST
        return b.SerializeToString()

    async with (
        gateway(redis_url, prefix, "gw1", "g1", metrics_port=0) as gw,
        api(redis_url, prefix, hedge_delay_ms="100", hedge_refill_ratio=0.2) as http,
        AsyncExitStack() as stack,
    ):
        sockets = await connect_all(stack, [gw], ["alice"])
        bus = http._transport.app.state.parts.bus  # type: ignore[attr-defined]
        for n in range(5):  # five successes: one token
            await bus.publish(BROADCAST, batch(n, ["nobody"]))
        await redis.execute_command("CLIENT", "PAUSE", "400", "WRITE")
        # Asking for its place in the log, as the push service's publisher does.
        logged = {"batch_id": "batch-99", SEQ: NEXT_SEQ}
        await bus.publish(BROADCAST, batch(99, ["alice"]), logged)
        assert await redis.xlen(stream_key(prefix, BROADCAST)) == 5 + 1  # one entry
        got = await frames(sockets)
        assert [f["msg_id"] for f in got["alice"]] == ["m99"]
        async with httpx.AsyncClient() as client:
            scrape = await client.get(f"http://127.0.0.1:{gw.metrics_port}/metrics")
        assert scrape.status_code == 200
        assert "imroute_gateway_duplicate_batches_total 0.0" in scrape.text
        push_metrics = (await http.get("/metrics")).text
        assert 'imroute_bus_hedges_sent_total{topic="broadcast"} 1.0' in push_metrics


@pytest.mark.parametrize("logged", [False, True], ids=["bus", "bus-as-log"])
async def test_redis_streams_publishes_are_hedged_too(
    logged: bool, redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    # CLIENT PAUSE holds every write on the server: the original XADD waits, a hedge
    # follows after the delay on another connection, and when the pause ends both land.
    # The first answer wins; the loser's XADD was already queued on the server: the
    # duplicate entry the gateways drop by batch id; where the stream is the topic's
    # log, the loser's script finds the batch is the topic's last entry: no duplicate.
    from prometheus_client import CollectorRegistry

    from router.bus import RedisStreamsBus
    from router.bus.redis_streams import TopicLog, stream_key

    registry = CollectorRegistry()
    async with RedisStreamsBus(
        redis_url,
        prefix,
        hedging=HedgingSettings(0.1, 50, 0.2),
        observer=PublishMetrics(registry),
        topic_log=TopicLog(300_000, 2000) if logged else None,
    ) as bus:
        for _ in range(5):  # one token
            await bus.publish(BROADCAST, b"warm-up")
        await redis.execute_command("CLIENT", "PAUSE", "400", "WRITE")
        started = time.monotonic()
        await bus.publish(BROADCAST, b"paused", {"batch_id": "b-paused", SEQ: NEXT_SEQ})
        assert time.monotonic() - started >= 0.3
    entries = await redis.xrange(stream_key(prefix, BROADCAST))
    paused = [fields for _, fields in entries if fields.get("data") == "paused"]
    # The original and its hedge both landed; as the log, the second was the first.
    assert len(paused) == (1 if logged else 2)
    assert all(f["attr:batch_id"] == "b-paused" for f in paused)
    assert all(("attr:seq" in f) is logged for f in paused)
    assert registry.get_sample_value("imroute_bus_hedges_sent_total", {"topic": BROADCAST}) == 1
