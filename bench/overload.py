"""Open-loop overload of a running push service (to measure its load shedding):

    IMROUTE_API_KEY=... .venv/bin/python -m bench.overload PORT RATE SECS CONNS

RATE pushes/s (to an offline uid) for SECS over CONNS pre-opened keep-alive connections
(no pipelining; a push waits for an idle connection when none is, on the client side).
Prints one JSON line: answers by status, the 200s' latency (answer - sent), the 503s',
the client-side wait (sent - due: a large one means the pool was exhausted or the
generator fell behind) and /healthz's latency, probed every 0.5 s on a connection of
its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time

HOST = "127.0.0.1"
BODY = b'{"to":["nobody"],"content":{"n":1}}'
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def push_request(key: str) -> bytes:
    head = (
        f"POST /v1/push HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    )
    return head.encode() + BODY


async def read_status(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


def quantile(values: list[float], q: float) -> int:
    """The q-quantile in ms (0 for none)."""
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000) if ordered else 0


async def run(port: int, rate: float, secs: float, conns: int, key: str) -> dict[str, int]:
    request = push_request(key)
    answers: list[tuple[int, float, float]] = []  # status, latency, client-side wait
    health: list[float] = []
    pool: asyncio.Queue[Conn] = asyncio.Queue()
    for _ in range(conns):
        pool.put_nowait(await asyncio.open_connection(HOST, port))

    async def one(due: float) -> None:
        reader, writer = await pool.get()
        sent = time.monotonic()
        writer.write(request)
        try:
            status = await read_status(reader)
        except (OSError, asyncio.IncompleteReadError):
            answers.append((0, 0.0, sent - due))
            return
        answers.append((status, time.monotonic() - sent, sent - due))
        pool.put_nowait((reader, writer))

    async def probe(until: float) -> None:
        reader, writer = await asyncio.open_connection(HOST, port)
        while time.monotonic() < until:
            began = time.monotonic()
            writer.write(HEALTHZ)
            await read_status(reader)
            health.append(time.monotonic() - began)
            await asyncio.sleep(0.5)

    start = time.monotonic() + 0.5
    tasks = [asyncio.create_task(probe(start + secs + 2))]
    n = 0
    while (due := start + n / rate) <= start + secs:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        tasks.append(asyncio.create_task(one(due)))
        n += 1
    await asyncio.wait_for(asyncio.gather(*tasks), 300)
    ok = [latency for status, latency, _ in answers if status == 200]
    shed = [latency for status, latency, _ in answers if status == 503]
    waits = [wait for _, _, wait in answers]
    return {
        "offered": n,
        "ok": len(ok),
        "shed": len(shed),
        "other": len(answers) - len(ok) - len(shed),
        "ok_p50_ms": quantile(ok, 0.5),
        "ok_p99_ms": quantile(ok, 0.99),
        "ok_over_2s": sum(1 for latency in ok if latency > 2),
        "shed_p99_ms": quantile(shed, 0.99),
        "client_wait_p50_ms": quantile(waits, 0.5),
        "client_wait_p99_ms": quantile(waits, 0.99),
        "healthz_p50_ms": round(statistics.median(health) * 1000),
        "healthz_max_ms": round(max(health) * 1000),
    }


def main() -> None:
    port, rate, secs, conns = sys.argv[1:5]
    result = asyncio.run(
        run(int(port), float(rate), float(secs), int(conns), os.environ["IMROUTE_API_KEY"])
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
