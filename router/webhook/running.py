"""The push service's webhook machinery, running: the outbox producers emit into, the
sender that delivers it and the offline sweeper (docs/guides/webhooks.md), plus their
counters on the service's /metrics. Entered by `push_service.wiring` while
IMROUTE_WEBHOOK_URL is set.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from router.redis.client import RedisClient
from router.webhook.outbox import RedisOutbox
from router.webhook.presence import RedisPresence
from router.webhook.sender import WebhookSender
from router.webhook.sweeper import LiveFleet, OfflineSweeper, RouteLookup
from shared.clock import Clock
from shared.keys import KeySchema
from shared.settings import PushSettings

__all__ = ["WebhookCounts", "running_webhooks"]


@asynccontextmanager
async def running_webhooks(
    settings: PushSettings,
    clock: Clock,
    keys: KeySchema,
    redis: RedisClient,
    registry: RouteLookup,
    fleet: LiveFleet,
    metrics: CollectorRegistry,
) -> AsyncIterator[RedisOutbox]:
    """The outbox (yielded: the `EventSink`), its sender and the sweeper, running."""
    url, secret = settings.webhook_url, settings.webhook_secret
    assert url is not None and secret is not None  # Settings requires the secret with a URL
    queue_max, grace_s = settings.webhook_queue_max, settings.webhook_offline_grace_s
    outbox = RedisOutbox(redis, keys, queue_max)
    sender = WebhookSender(
        redis,
        keys,
        outbox,
        clock,
        url=url,
        secret=secret.get_secret_value(),
        timeout_s=settings.webhook_timeout_s,
        batch_max=settings.webhook_batch_max,
        backoff_max_s=settings.webhook_backoff_max_s,
    )
    presence = RedisPresence(redis, keys, clock, grace_s=grace_s, queue_max=queue_max)
    # user.offline at most a quarter grace late; a gone gateway noticed within 2 x grace
    every_s, adopt_s = min(1.0, max(0.05, grace_s / 4)), min(5.0, max(1.0, grace_s))
    sweeper = OfflineSweeper(presence, registry, fleet, clock, every_s, adopt_s)
    collector = WebhookCounts(sender)
    metrics.register(collector)
    try:
        async with sender.running(), sweeper.running():
            yield outbox
    finally:
        metrics.unregister(collector)


class WebhookCounts(Collector):
    """The webhook sender's counters (this process) and the outbox's (fleet-wide)."""

    def __init__(self, sender: WebhookSender) -> None:
        self._sender = sender

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        sender, stats = self._sender, self._sender.stats  # stats: read every second
        for name, doc, value in (
            ("sent", "Webhook events this process delivered (2xx)", sender.sent),
            ("retried", "Webhook POSTs that failed and were retried", sender.retried),
            (
                "dropped",
                "Webhook events the receiver refused (a 4xx but 408 and 429, or a 3xx), dropped",
                sender.dropped,
            ),
            ("overflowed", "Webhook events a full outbox refused, fleet-wide", stats.overflowed),
        ):
            yield CounterMetricFamily(f"imroute_webhook_{name}", doc, value)
        cut = CounterMetricFamily(
            "imroute_webhook_cut",
            "Webhook POSTs cut off: no answer within IMROUTE_WEBHOOK_TIMEOUT_S (deadline, "
            "retried) or an answer's body over 4 KiB or not whole by then (long_answer)",
            labels=["reason"],
        )
        for reason, counted in sender.cuts.items():
            cut.add_metric([reason.value], counted.total)
        yield cut
        queued = "Webhook events not yet delivered, fleet-wide"
        yield GaugeMetricFamily("imroute_webhook_queue_length", queued, stats.queued)
