"""What a budgeted read of a topic log costs Redis itself, on a Redis of the test's own
(so `INFO` counts only it): a log of 100 entries of about 210 KB (3000 64-character
uids a batch), read from a place 99 behind the head within a 1 MiB budget, 20 times;
the log as a list (logged apart from the bus) and as the bus stream.

The read goes backward from the head in chunks sized by what is left of the budget, so
Lua holds about the budget and one entry (it held 64 entries, 13 MB, before: 48 ms of
Redis each, all other clients waiting)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from router.bus.base import NEXT_SEQ, SEQ
from router.bus.factory import open_bus
from router.bus.redis_streams import TopicLog
from router.recovery.base import RecoveryLimits
from router.recovery.store import RedisRecoveryStore
from router.redis.client import connect_redis
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.positions import counter_of, epoch_of, seq_of
from shared.proto import gateway_pb2
from tests.integration.redis_process import redis_process

pytestmark = pytest.mark.integration

BUDGET = 1 << 20


@pytest.mark.parametrize(
    ("on_bus", "below_head"),
    [(False, False), (True, False), (True, True)],
    ids=["list", "stream", "stream-below-the-head"],
)
async def test_a_read_far_behind_the_head_holds_about_the_budget_in_lua(
    on_bus: bool, below_head: bool
) -> None:
    with redis_process() as server:
        async with (
            connect_redis(server.url) as client,
            open_bus(server.url, "cost:", topic_log=TopicLog(300_000, 2000)) as bus,
        ):
            store = RedisRecoveryStore(
                client, KeySchema("cost:"), SystemClock(), RecoveryLimits(), topics_on_bus=on_bus
            )
            for n in range(100):
                batch = gateway_pb2.Batch(
                    batch_id=f"b{n}",
                    message=gateway_pb2.Message(msg_id=f"m{n}", content_json=b'"x"'),
                    uids=[f"{n}-{i:04d}".ljust(64, "u") for i in range(3000)],
                    mode=gateway_pb2.MODE_MULTICAST,
                    group_id="g",
                )
                if on_bus:
                    placed = {"batch_id": f"b{n}", SEQ: NEXT_SEQ}
                    await bus.publish("group.g", batch.SerializeToString(), placed)
                else:
                    await store.append_batch("group.g", batch)
            [seq] = await store.heads(["group.g"])
            info = aioredis.from_url(server.url, decode_responses=True)
            try:
                await info.config_resetstat()
                used = int((await info.info("memory"))["used_memory"])
                far = seq_of(epoch_of(seq), counter_of(seq) - 99)
                # Up to 8 below the head (a gateway's mark trails the head by what is in
                # flight), on the stream: the 8 above are passed over, read but not held
                # (the list reads its range by index). Each costs Redis about 0.3 ms.
                upto = seq_of(epoch_of(seq), counter_of(seq) - 8) if below_head else seq
                for _ in range(20):
                    got = await store.read_span("group.g", far, upto, 1000, BUDGET)
                    assert got.over and 0 < sum(got.sizes) <= BUDGET
                    assert got.start == seq_of(epoch_of(upto), counter_of(upto) - len(got.batches))
                stats = await info.info("commandstats")
                peak = int((await info.info("memory"))["used_memory_peak"])
            finally:
                await info.aclose()
    script = stats["cmdstat_evalsha"]
    print(f"evalsha {script['usec_per_call']} us a read; peak +{peak - used} bytes")
    # Before: 48 ms and 12.5 MB a read; now about 2 ms and 1.2 MB (the reply included).
    assert script["usec_per_call"] < 15_000, script
    assert peak - used < 4 * BUDGET, peak - used
