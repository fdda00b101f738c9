"""The HTTP floor: CPU per request of the push service's HTTP server with nothing behind it.

    .venv/bin/python -m bench.http_floor [--requests N] [--conns C] [--rounds R]

uvicorn as the push service runs it (`push_service.http_server.run`: httptools, uvloop,
the head deadline and limits), one process, serving an ASGI app that reads the body and
answers a fixed JSON of POST /v1/push's size at once. A client in this process sends N
pushes' worth of POST /v1/push over C keep-alive connections (the peers' load generator
uses 64), one request at a time on each; the server's CPU comes from /proc. What a push
costs the push service above this figure is FastAPI, the gates and the push itself.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

from starlette.types import Receive, Scope, Send

from bench.harness.stats import cpu_seconds
from router.processes.ports import free_port, port_free

BODY = b'{"to":["4242"],"content":{"ts":1733000000000,"tsend":1733000000000,"seq":12345}}'
ANSWER = (
    b'{"push_id":"0123456789abcdef0123456789abcdef.0Cb","msg_id":"0123456789abcdef0123456789abcdef",'
    b'"delivered":["4242"],"offline":[],"failed":[],"queued":[],"errors":[]}'
)
REQUEST = (
    b"POST /v1/push HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer bench-key-0123456789\r\n"
    b"Content-Type: application/json\r\nContent-Length: " + str(len(BODY)).encode() + b"\r\n\r\n"
) + BODY


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the request's body, answers ANSWER."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": ANSWER})


def serve(port: int) -> None:
    from push_service.http_server import run
    from shared.settings import PushSettings

    settings = PushSettings.load(
        {}, host="127.0.0.1", port=port, api_key="bench-key-0123456789", log_level="warning"
    )
    run(app, settings)


def cpu_s(pid: int) -> float:
    spent = cpu_seconds(pid)
    if spent is None:
        raise SystemExit(f"the server (pid {pid}) is gone")
    return spent


async def drive(port: int, requests: int, conns: int) -> float:
    """Send `requests` over `conns` connections, one at a time on each; seconds taken."""
    per = requests // conns

    async def one_conn() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(per):
                writer.write(REQUEST)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(one_conn() for _ in range(conns)))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64_000)
    parser.add_argument("--conns", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    import uvloop

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.http_floor", "--serve", str(port)])
    try:
        for _ in range(100):
            if not port_free(port):  # the server holds it: listening
                break
            time.sleep(0.1)
        uvloop.run(drive(port, args.conns * 10, args.conns))  # warm up
        per_request: list[float] = []
        for _ in range(args.rounds):
            before = cpu_s(server.pid)
            took = uvloop.run(drive(port, args.requests, args.conns))
            spent = cpu_s(server.pid) - before
            done = args.requests // args.conns * args.conns
            per_request.append(spent / done * 1e6)
            print(f"{done} requests in {took:.2f} s ({done / took:,.0f}/s): "
                  f"server CPU {per_request[-1]:.1f} µs per request", flush=True)  # fmt: skip
        print(f"median of {args.rounds}: {statistics.median(per_request):.1f} µs per request")
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
