"""Traces with a collector that stops answering: a real collector process
(bench/otlp_sink.py) SIGSTOPped while pushes go on. Exporting happens in each process's
own thread, so a push must not wait for it: every push still answers and is delivered at
once, and once the collector is continued the processes export again."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import httpx
import pytest

from router.processes.ports import free_port
from tests.integration.procs import BIN, base_env, read_until, running
from tests.integration.stack import AUTH, recv_json
from tests.integration.traces import clients, processes

pytestmark = pytest.mark.integration

STOPPED_PUSHES = 20


async def test_a_stopped_collector_holds_no_push_and_spans_flow_once_it_is_back(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    sink_argv = [str(BIN / "python"), "-m", "bench.otlp_sink", "--port", str(port)]
    with running(sink_argv, base_env()) as sink:
        read_until(sink, "otlp sink on")
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: export at once, so the stop is met
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2",  # s: each export to the stopped sink times out
        }
        with processes(redis_url, prefix, tmp_path, env) as stack:
            async with httpx.AsyncClient(timeout=30) as http, clients(stack, http) as sockets:

                async def push(n: int) -> float:
                    started = time.monotonic()
                    resp = await http.post(
                        f"{stack.api}/v1/push", json={"to": ["a1"], "content": n}, headers=AUTH
                    )
                    assert resp.status_code == 200 and resp.json()["delivered"] == ["a1"], resp.text
                    assert (await recv_json(sockets["a1"], timeout=10))["content"] == n
                    return time.monotonic() - started

                await push(0)
                await asyncio.sleep(0.5)  # its spans go out while the sink answers
                sink.send_signal(signal.SIGSTOP)
                try:
                    took = [await push(n) for n in range(1, STOPPED_PUSHES + 1)]
                    # Exports to the stopped sink hang for their timeout (2 s, then
                    # retries) in the exporters' threads; no push waits on one.
                    await asyncio.sleep(3)
                    took.append(await push(STOPPED_PUSHES + 1))
                finally:
                    sink.send_signal(signal.SIGCONT)
                assert max(took) < 1.0, took
                took_after = await push(STOPPED_PUSHES + 2)
                assert took_after < 1.0
                await asyncio.sleep(4)  # past the exporters' retry backoff
        # The processes are stopped (their spans flushed at exit); the sink counts.
        sink.send_signal(signal.SIGTERM)
        counts = json.loads(read_until(sink, '"spans"', 15)[-1])
    # Each push here is 4 spans (request, look-up, call, delivery: the client does not
    # ack, so no acks span) from 3 processes; some exports to the stopped sink may have
    # been given up. At least the pushes before and after the stop must have arrived.
    assert counts["spans"] >= 2 * 4, counts
    assert counts["requests"] >= 2, counts
