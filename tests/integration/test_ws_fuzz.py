"""A bounded WebSocket fuzz of a real gateway process.

`ws_fuzz_attacks` throws random frames, fragments, oversized and control frames,
invalid UTF-8, slowloris heads, half-closed sockets and floods of connects and frames
at the gateway from a process of its own, while a well-behaved client on the same
gateway gets a P2P push (a gateway call) every 20 ms. The gateway must stay up, its
memory bounded, and the good client's pushes must keep arriving, p99 under 100 ms.
Nothing is asserted about how the junk is answered (an HTTP error, or a 101 and a
close): only that the gateway survives it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from router.gateway_rpc.client import GrpcGatewayClients
from router.testing import deliver_one
from shared.batches import to_batch
from shared.clock import SystemClock
from shared.models import Message
from tests.integration.procs import BIN, Proc, base_env, gateway_env, read_until, running
from tests.integration.stack import ready, token

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
FUZZ_S = 12.0
PUSH_EVERY_S = 0.02
P99_LIMIT_S = 0.100
RSS_GROWTH_LIMIT = 100 * 1024 * 1024


def rss(pid: int) -> int:
    """Resident memory of `pid` in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def pushes_received(
    ws: ClientConnection, sent: dict[int, float], got: dict[int, float]
) -> None:
    """Record when each push `n` reached the good client."""
    async for data in ws:
        frame = json.loads(data)
        if frame.get("type") == "push":
            n = frame["content"]["n"]
            got[n] = time.monotonic() - sent[n]


async def push_every(
    clients: GrpcGatewayClients, grpc_address: str, until: float, sent: dict[int, float]
) -> None:
    """A P2P push to the good client every PUSH_EVERY_S, each with a fresh batch id."""
    clock = SystemClock()
    n = 0
    next_at = time.monotonic()
    while time.monotonic() < until:
        n += 1
        content = json.dumps({"n": n}).encode()
        batch = to_batch(
            Message(f"m{n}", f"p{n}", 0, "fuzz", content, clock.now_ms()), ["good"], f"b{n}"
        )
        batch.expires_ms = clock.now_ms() + 10_000
        sent[n] = time.monotonic()
        reply = await deliver_one(clients, "gwf", grpc_address, batch, 2.0)
        assert list(reply.delivered) == ["good"], reply
        next_at += PUSH_EVERY_S
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def start_fuzzer(port: int, seed: int) -> Any:
    env = base_env(PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "tests.integration.ws_fuzz_attacks"]
    return running([*argv, "--port", str(port), "--seconds", str(FUZZ_S), "--seed", str(seed)], env)


def output(proc: Proc) -> str:
    """Every line `proc` printed that was not read yet (it has exited)."""
    assert proc.lines is not None
    lines = []
    while (line := proc.lines.get(timeout=5)) is not None:
        lines.append(line)
    return "\n".join(lines)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def test_the_gateway_survives_a_fuzz_and_keeps_delivering(
    redis_url: str, prefix: str
) -> None:
    env = gateway_env(redis_url, prefix)
    argv = [str(BIN / "imroute"), "gateway", "--id", "gwf", "--group", "g1"]
    seed = int(os.environ.get("IMROUTE_FUZZ_SEED", str(int(time.time()))))
    clients = GrpcGatewayClients()
    with running([*argv, "--ws-port", "0", "--grpc-port", "0"], env) as gateway:
        line = read_until(gateway, "ready")[-1]
        ws_url = re.search(r"ws=(\S+)", line)
        grpc_address = re.search(r"grpc=(\S+)", line)
        assert ws_url and grpc_address, line
        port = int(ws_url.group(1).rsplit(":", 1)[1].split("/")[0])
        good = await connect(f"{ws_url.group(1)}?token={token('good')}")
        await ready(good)
        baseline = rss(gateway.pid)
        sent: dict[int, float] = {}
        got: dict[int, float] = {}
        receiver = asyncio.create_task(pushes_received(good, sent, got))
        peak = baseline
        with start_fuzzer(port, seed) as fuzzer:
            await asyncio.to_thread(read_until, fuzzer, "fuzz started", 10)
            pusher = asyncio.create_task(
                push_every(clients, grpc_address.group(1), time.monotonic() + FUZZ_S, sent)
            )
            while not pusher.done():
                peak = max(peak, rss(gateway.pid))
                assert gateway.poll() is None, "the gateway died"
                await asyncio.sleep(0.25)
            await pusher  # raises if a Deliver failed
            summary = await asyncio.to_thread(read_until, fuzzer, "fuzz done", 20)
        stats = json.loads(summary[-1].split("fuzz done ", 1)[1])
        for _ in range(100):  # the last pushes in flight
            if len(got) == len(sent):
                break
            await asyncio.sleep(0.02)
        receiver.cancel()

        assert gateway.poll() is None, "the gateway died"
        context = f"seed={seed} fuzz={stats}"
        # The fuzz really ran: thousands of hostile connections and frames.
        assert stats["upgrades"] > 200 and stats["connects"] > 200, context
        assert stats["flood_frames"] > 10_000 and stats["runs.slowloris"] >= 40, context
        assert len(sent) > FUZZ_S / PUSH_EVERY_S / 2, (len(sent), context)
        missing = sorted(set(sent) - set(got))
        assert not missing, (missing[:10], context)
        assert p99(list(got.values())) < P99_LIMIT_S, (p99(list(got.values())), context)
        assert peak - baseline < RSS_GROWTH_LIMIT, (baseline, peak, context)
        # The good client is still connected, and a newcomer is served.
        await good.send('{"type":"ping"}')
        async with connect(f"{ws_url.group(1)}?token={token('later')}") as later:
            await ready(later)
        await good.close()
        gateway.send_signal(signal.SIGINT)  # stop now
        await asyncio.to_thread(gateway.wait, 15)
        # Junk is answered, logged at most as a warning: never an unexpected exception.
        log = output(gateway)
        assert "Traceback" not in log, log[-5000:]
    await clients.close()
