"""Choosing the bus from IMROUTE_BUS_URL: which URLs give which bus, and which are refused
(naming the setting, and never echoing a password). Nothing is connected."""

from __future__ import annotations

import pytest

from router.bus import BROADCAST, HedgedBus, MemoryBus, MemoryTransport, RedisStreamsBus, open_bus
from router.bus.pubsub import PubSubBus
from shared.errors import ConfigError


@pytest.mark.parametrize(
    "url",
    [
        "",
        "localhost:6379",
        "http://user:s3cret@example.com",
        "redis+cluster://127.0.0.1:7000",
        "pubsub://",
        "pubsub://My Project",
        "pubsub://ab",
        "pubsub://my-project/topics/x",
        "redis://127.0.0.1:notaport/0",
    ],
)
def test_open_bus_refuses_bad_urls(url: str, prefix: str) -> None:
    with pytest.raises(ConfigError, match="IMROUTE_BUS_URL") as info:
        open_bus(url, prefix)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "rediss://127.0.0.1:6380/0", "unix:///tmp/none.sock"]
)
async def test_open_bus_takes_redis_urls(url: str, prefix: str) -> None:
    bus = open_bus(url, prefix)  # nothing is connected yet
    assert isinstance(bus, RedisStreamsBus) and isinstance(bus, HedgedBus)
    await bus.close()


@pytest.mark.parametrize("url", ["pubsub://my-project", "pubsub://example.com:my-project-1"])
async def test_open_bus_takes_pubsub_urls(url: str, prefix: str) -> None:
    bus = open_bus(url, prefix)  # nothing is connected yet
    assert isinstance(bus, PubSubBus)
    await bus.close()


async def test_open_bus_takes_memory_urls(prefix: str) -> None:
    bus = open_bus("memory://", prefix)
    assert isinstance(bus, MemoryBus) and isinstance(bus.transport, MemoryTransport)
    assert isinstance(bus, HedgedBus)
    other = open_bus("memory://", prefix)
    assert other is not bus  # each one a bus of its own
    await bus.close()
    await other.close()


async def test_pubsub_without_credentials_names_what_to_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    for name in ("PUBSUB_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no gcloud application-default file
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # and no metadata server to ask
    bus = open_bus("pubsub://my-project", "imroute:")
    with pytest.raises(ConfigError, match="GOOGLE_APPLICATION_CREDENTIALS"):
        await bus.prepare([BROADCAST], "gw1")
    await bus.close()


def test_settings_refuse_the_in_process_bus_naming_the_way_to_share_it() -> None:
    from shared.settings import Settings

    with pytest.raises(ConfigError, match=r"IMROUTE_BUS_URL.*memory://.*create_app.*Gateway"):
        Settings.load({"IMROUTE_BUS_URL": "memory://"})
    for url in ("redis://127.0.0.1:6379/0", "pubsub://my-project"):
        assert Settings.load({"IMROUTE_BUS_URL": url}).bus_url == url


@pytest.mark.parametrize(
    ("env", "on_bus"),
    [
        ({}, True),  # the default: Redis Streams on IMROUTE_REDIS_URL
        ({"IMROUTE_BUS_URL": "redis://127.0.0.1:6379/0"}, True),  # that URL, named
        ({"IMROUTE_BUS_URL": "redis://127.0.0.1:6380/0"}, False),  # another Redis
        ({"IMROUTE_BUS_URL": "pubsub://my-project"}, False),
        (
            {
                "IMROUTE_REDIS_URL": "redis+cluster://127.0.0.1:7000",
                "IMROUTE_BUS_URL": "redis://127.0.0.1:6379/0",
            },
            False,
        ),
    ],
)
async def test_the_stream_is_the_topic_log_only_on_the_recovery_stores_redis(
    env: dict[str, str], on_bus: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a publish can give the batch its place in the topic's sequence in one
    script: the stream and the sequence on one Redis."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:1")  # a Pub/Sub bus needs one
    from router.bus.factory import bus_from_settings, topic_log_from_settings
    from shared.settings import Settings

    settings = Settings.load({"IMROUTE_REDIS_URL": "redis://127.0.0.1:6379/0", **env})
    assert settings.topic_log_on_bus is on_bus
    log = topic_log_from_settings(settings)
    assert (log is not None) is on_bus
    if log is not None:
        assert (log.window_ms, log.max_entries) == (300_000, 2000)
    bus = bus_from_settings(settings)  # nothing is connected yet
    assert bus.logs_topics is on_bus
    await bus.close()
