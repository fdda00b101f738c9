"""A minimal imroute client, written from docs/clients/protocol.md alone (the standard
library and `websockets`): it prints each frame (a push once, by msg_id), acks the last
`pos` every 100 ms and reconnects with `since=<last pos>`; a refused token exits 2.

    IMROUTE_TOKEN=<JWT> python examples/minimal_client.py http://127.0.0.1:8080  # dispatch
    python examples/minimal_client.py ws://127.0.0.1:8101/ws <JWT>  # that gateway
"""

import asyncio
import contextlib
import json
import os
import random
import sys
import urllib.error
import urllib.request

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.typing import Subprotocol


def dispatch(api: str, token: str) -> str:
    url = f"{api.rstrip('/')}/v1/dispatch"
    ask = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(ask, timeout=10) as answer:
        return str(json.load(answer)["ws_url"])


async def send_acks(ws: ClientConnection, got: list[str]) -> None:
    """Acks are cumulative: the last pos this connection sent, at most every 100 ms."""
    sent = None
    with contextlib.suppress(ConnectionClosed):
        while ws.close_code is None:
            await asyncio.sleep(0.1)
            if got and got[-1] != sent:
                sent = got[-1]
                await ws.send(json.dumps({"type": "ack", "pos": sent}))


async def main(target: str, token: str) -> int:
    offer = [Subprotocol("imroute.v1"), Subprotocol(f"imroute.jwt.{token}")]  # not in the URL
    pos: str | None = None  # the last push processed: `since` on every reconnect
    seen: dict[str, None] = {}  # the last 10,000 msg_ids, across connections
    failures, loop = 0, asyncio.get_running_loop()
    while True:
        code, started = 0, loop.time()
        retry: str | None = None  # a refusal's Retry-After
        try:
            url = target
            if not target.startswith("ws"):  # an API URL: dispatch names the gateway
                url = await asyncio.to_thread(dispatch, target, token)
            url += f"{'&' if '?' in url else '?'}since={pos}" if pos else ""  # pos is URL-safe
            async with connect(url, subprotocols=offer) as ws:
                got: list[str] = []  # this connection's last pos: acks name their own
                acks = asyncio.create_task(send_acks(ws, got))
                with contextlib.suppress(ConnectionClosed):
                    async for data in ws:
                        frame = json.loads(data)
                        if frame["type"] != "push" or frame["msg_id"] not in seen:
                            print(data, flush=True)  # the app's work (a duplicate: none)
                        if frame["type"] == "push":
                            seen[frame["msg_id"]] = None
                            if len(seen) > 10_000:
                                del seen[next(iter(seen))]
                            pos = frame["pos"]
                            got[:] = [frame["pos"]]
                acks.cancel()
            code = ws.close_code or 1006  # 1006: no close frame came
            failures = 0 if code == 4503 or loop.time() - started > 5 else failures
        except InvalidStatus as exc:  # the gateway answered the handshake with HTTP
            code, retry = exc.response.status_code, exc.response.headers.get("Retry-After")
        except urllib.error.HTTPError as exc:  # so did dispatch
            code, retry = exc.code, exc.headers.get("Retry-After")
        except (OSError, TimeoutError, ValueError, KeyError, WebSocketException) as exc:
            print(f"failed: {exc!r}", file=sys.stderr, flush=True)
        print(f"disconnected: {code}", file=sys.stderr, flush=True)
        if code == 401:
            return 2  # the token is refused: a new one is needed
        backoff = min(5.0, 0.1 * 2**failures) * (0.5 + random.random())
        await asyncio.sleep(max(backoff, float(retry or 0)))
        failures += 1


if __name__ == "__main__":
    token = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("IMROUTE_TOKEN")
    if len(sys.argv) < 2 or not token:
        sys.exit(__doc__)
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(main(sys.argv[1], token)))
