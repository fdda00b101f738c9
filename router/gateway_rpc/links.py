"""Which gateways the router reaches over a delivery link (router.gateway_rpc.link), and
the opening of links in the background.

Per gateway address: an open link; or a task opening one (ask the gateway's gRPC `Link`
method for its port and a ticket, connect, hello); or the time to try again (a link
that could not be opened, or broke, is tried again RETRY_S later, and after each failure
to open one twice as late, up to RETRY_MAX_S); or nothing to try: a
gateway that offers no link (port 0). Until a link is open, calls go in gRPC
DeliverMany calls: nothing waits for a link.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable

from router.gateway_rpc.link import DeliveryLink, open_link
from shared.backoff import backoff_s
from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2

__all__ = ["OPEN_TIMEOUT_S", "RETRY_MAX_S", "RETRY_S", "Links", "host_of", "retry_in"]

log = logging.getLogger(__name__)

OPEN_TIMEOUT_S = 2.0
RETRY_S = 5.0
RETRY_MAX_S = 60.0


def retry_in(failures: int) -> float:
    """How long after its `failures`-th failure in a row a link is tried again."""
    return backoff_s(failures, RETRY_S, RETRY_MAX_S, rand=None)


# Asks a gateway (id, address) for its link: port and ticket.
Ask = Callable[[str, str], Awaitable[gateway_pb2.LinkReply]]


def host_of(address: str) -> str:
    """The host of a gRPC address: `10.0.0.5:9101` -> `10.0.0.5`, `[::1]:9101` -> `::1`."""
    host = address.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


class Links:
    def __init__(
        self,
        ask: Ask,
        tls: ssl.SSLContext | None = None,
        server_name: str | None = None,
        grace_s: float = 5.0,
    ) -> None:
        self._ask = ask
        self._tls = tls
        self._server_name = server_name
        self._grace_s = grace_s
        self._open: dict[str, DeliveryLink] = {}
        self._opening: dict[str, asyncio.Task[None]] = {}
        self._retry_at: dict[str, float] = {}
        self._none: set[str] = set()  # addresses that offer no link
        self._failures: dict[str, int] = {}  # failed opens in a row, per address
        self._ending: set[asyncio.Task[None]] = set()
        self.opened = 0

    def get(self, gateway_id: str, address: str) -> DeliveryLink | None:
        """The open link to `address`, or None (then one is being opened, if it may)."""
        link = self._open.get(address)
        if link is not None:
            if link.usable and link.gateway_id == gateway_id:
                return link
            del self._open[address]
            self._end(link)
            if not link.usable:
                self._retry_at[address] = asyncio.get_running_loop().time() + RETRY_S
        if address in self._none or address in self._opening:
            return None
        now = asyncio.get_running_loop().time()
        if now < self._retry_at.get(address, 0.0):
            return None
        self._opening[address] = asyncio.create_task(
            self._open_one(gateway_id, address), name=f"link-open:{address}"
        )
        return None

    async def _open_one(self, gateway_id: str, address: str) -> None:
        try:
            reply = await self._ask(gateway_id, address)
            if reply.port == 0:
                self._none.add(address)
                log.info("gateway %s offers no delivery link: calls go over gRPC", gateway_id)
                return
            if reply.gateway_id and reply.gateway_id != gateway_id:
                raise GatewayUnavailable(gateway_id, f"{address} is now {reply.gateway_id}")
            link = await open_link(
                gateway_id,
                host_of(address),
                reply.port,
                reply.ticket,
                OPEN_TIMEOUT_S,
                self._tls,
                self._server_name,
            )
        except GatewayUnavailable as exc:
            failures = self._failures[address] = self._failures.get(address, 0) + 1
            wait = retry_in(failures)
            self._retry_at[address] = asyncio.get_running_loop().time() + wait
            if failures == 1 or wait >= RETRY_MAX_S:  # at most a line a minute, then
                log.warning(
                    "no delivery link to gateway %s yet (%d tries; calls go over gRPC; "
                    "again in %gs): %s",
                    gateway_id,
                    failures,
                    wait,
                    exc.reason,
                )
            return
        finally:
            if self._opening.get(address) is asyncio.current_task():
                del self._opening[address]
        self.opened += 1
        self._retry_at.pop(address, None)
        self._failures.pop(address, None)
        self._open[address] = link

    def _end(self, link: DeliveryLink) -> None:
        task = asyncio.create_task(link.ended(self._grace_s), name="link-end")
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    def forget(self, address: str) -> None:
        """The gateway at `address` left or restarted: its link ends (calls on it get the
        grace), and whether it offers one is asked again."""
        link = self._open.pop(address, None)
        if link is not None:
            self._end(link)
        task = self._opening.pop(address, None)
        if task is not None:
            task.cancel()
        self._retry_at.pop(address, None)
        self._failures.pop(address, None)
        self._none.discard(address)

    def retain(self, addresses: Iterable[str]) -> None:
        keep = set(addresses)
        known = {*self._open, *self._opening, *self._retry_at, *self._none, *self._failures}
        for address in known - keep:
            self.forget(address)

    def __len__(self) -> int:
        return len(self._open)

    async def close(self) -> None:
        for task in list(self._opening.values()):
            task.cancel()
        await asyncio.gather(*self._opening.values(), return_exceptions=True)
        links = list(self._open.values())
        self._open.clear()
        for link in links:
            link.close()
        while self._ending:
            await asyncio.gather(*list(self._ending), return_exceptions=True)
