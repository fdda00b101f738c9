"""Request heads too large or without end, as an attacker sends them, and what the target
process costs meanwhile: blocking sockets in threads (the answer stays readable after
the reset that a close over unread data causes), the process's RSS and CPU sampled."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import psutil

from tests.integration.http_raw import HOST, Answer, read_answer_blocking

KIB = 1024
MIB = 1 << 20
# 64 KiB of short header fields, as a bomb sends them: each a tuple of two bytes
# objects to a server that keeps them, about 13 times its size on the wire.
FIELDS = b"X-Bomb: a\r\n" * (64 * KIB // 11)


@dataclass
class Sent:
    """What one attacking socket got: the answer (None: closed without one) and how many
    bytes it put into the socket before the server cut it."""

    answer: Answer | None
    sent: int


def send_head(
    port: int, start: bytes, piece: bytes = b"", total: int = 0, timeout: float = 20
) -> Sent:
    """Send `start`, then `piece` again and again up to `total` bytes or until the server
    cuts the connection; then read the answer."""
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sent = 0
        try:
            sock.sendall(start)
            while sent < total:
                sock.sendall(piece)
                sent += len(piece)
        except OSError:
            pass
        try:
            return Sent(read_answer_blocking(sock), sent)
        except (ConnectionError, AssertionError):
            return Sent(None, sent)


async def send_heads(n: int, port: int, start: bytes, piece: bytes, total: int) -> list[Sent]:
    """`send_head` on `n` sockets at once (a thread each)."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(n) as threads:
        sends = [
            loop.run_in_executor(threads, send_head, port, start, piece, total) for _ in range(n)
        ]
        return list(await asyncio.gather(*sends))


@dataclass
class Watch:
    """A process watched while an attack runs: its RSS at the start and at its highest,
    its CPU seconds, and how long each probe (an honest request) took."""

    process: psutil.Process
    rss_before: int = 0
    rss_peak: int = 0
    cpu_s: float = 0.0
    probes_s: list[float] = field(default_factory=list)

    @property
    def grew_mib(self) -> float:
        return (self.rss_peak - self.rss_before) / MIB

    @property
    def slowest_probe_s(self) -> float:
        return max(self.probes_s)


@asynccontextmanager
async def watching(pid: int, probe: Callable[[], object]) -> AsyncIterator[Watch]:
    """Sample the process's RSS every 20 ms and run `probe` (blocking, in a thread of
    its own) every 100 ms while the block runs."""
    loop = asyncio.get_running_loop()
    prober = ThreadPoolExecutor(1)
    process = psutil.Process(pid)
    watch = Watch(process, rss_before=process.memory_info().rss)
    watch.rss_peak = watch.rss_before
    cpu = process.cpu_times()

    async def sample() -> None:
        while True:
            watch.rss_peak = max(watch.rss_peak, process.memory_info().rss)
            await asyncio.sleep(0.02)

    async def probing() -> None:
        while True:
            began = time.perf_counter()
            await loop.run_in_executor(prober, probe)
            watch.probes_s.append(time.perf_counter() - began)
            await asyncio.sleep(0.1)

    tasks = [asyncio.create_task(sample()), asyncio.create_task(probing())]
    try:
        yield watch
        await asyncio.sleep(0.3)  # a last probe and sample after the attack
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        prober.shutdown()
    after = process.cpu_times()
    watch.cpu_s = (after.user - cpu.user) + (after.system - cpu.system)
    watch.rss_peak = max(watch.rss_peak, process.memory_info().rss)


def ask(port: int, request: bytes, timeout: float = 10) -> Answer:
    """One request on its own connection, and its answer."""
    got = send_head(port, request, timeout=timeout)
    assert got.answer is not None, "closed without an answer"
    return got.answer
