"""Where users and gateways are, in memory: Userinfo (the route registry), the fleet
and its drain requests, behind the router's seams (see `router.testing.stores`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from router.routes.base import RecipientGroups, RouteOp
from shared.clock import Clock
from shared.models import GatewayInfo, Registration, Route

__all__ = [
    "AMY_ROUTE",
    "MemoryDrainRequests",
    "MemoryGatewayFleet",
    "MemoryRouteRegistry",
    "OneRoute",
    "OneRouteFleet",
]


class MemoryRouteRegistry:
    """Userinfo in a dict: each uid's connections, as one gateway (the one named here)
    registers them. A test adds routes on other gateways with `add`."""

    def __init__(
        self,
        clock: Clock,
        gateway_id: str = "gw1",
        group_id: str = "g1",
        address: tuple[str, int] = ("127.0.0.1", 1),
    ) -> None:
        self._clock = clock
        self._gateway = (gateway_id, group_id, *address)
        self.routes: dict[str, dict[str, Route]] = {}  # uid -> conn_id -> route

    def add(self, route: Route) -> None:
        self.routes.setdefault(route.uid, {})[route.conn_id] = route

    async def register(self, uid: str, conn_id: str) -> None:
        await self.apply([RouteOp(True, uid, conn_id, new=True)])

    async def unregister(self, uid: str, conn_id: str) -> None:
        await self.apply([RouteOp(False, uid, conn_id)])

    async def unregister_many(self, registrations: Iterable[Registration]) -> None:
        await self.apply([RouteOp(False, r.uid, r.conn_id) for r in registrations])

    async def apply(self, ops: Sequence[RouteOp]) -> list[bool]:
        gateway_id, group_id, ip, port = self._gateway
        for op in ops:
            if op.register:
                expires = self._clock.now_ms() + 60_000
                self.add(Route(op.uid, op.conn_id, gateway_id, group_id, ip, port, expires))
            else:
                self.routes.get(op.uid, {}).pop(op.conn_id, None)
        return [True] * len(ops)

    async def refresh(self, registrations: Iterable[Registration]) -> list[Registration]:
        regs = list(registrations)
        missing = [r for r in regs if r.conn_id not in self.routes.get(r.uid, {})]
        await self.apply([RouteOp(True, r.uid, r.conn_id) for r in regs])
        return missing

    async def lookup(self, uids: Sequence[str]) -> dict[str, list[Route]]:
        return {u: list(self.routes[u].values()) for u in uids if self.routes.get(u)}

    async def remove(self, routes: Iterable[Route]) -> None:
        for r in routes:
            self.routes.get(r.uid, {}).pop(r.conn_id, None)

    async def lookup_groups(self, uids: Sequence[str]) -> RecipientGroups:
        found = RecipientGroups()
        for uid, routes in (await self.lookup(uids)).items():
            found.online += 1
            for group in sorted({r.group_id for r in routes}):
                found.by_group.setdefault(group, []).append(uid)
        return found


class MemoryGatewayFleet:
    """The live gateways, announced and withdrawn by hand."""

    def __init__(self, *gateways: GatewayInfo) -> None:
        self.gateways = {g.gateway_id: g for g in gateways}

    async def announce(self, info: GatewayInfo) -> bool:
        new = info.gateway_id not in self.gateways
        self.gateways[info.gateway_id] = info
        return new

    async def withdraw(self, gateway_id: str) -> None:
        self.gateways.pop(gateway_id, None)

    async def live(self) -> list[GatewayInfo]:
        return list(self.gateways.values())


# The P2P path's smallest world: amy, connected once, on gateway gw1 (`OneRoute`,
# `OneRouteFleet`): what P2PPusher's unit tests and bench.p2p_inprocess push through.
AMY_ROUTE = Route("amy", "c1", "gw1", "g1", "10.0.0.1", 7000, 0)


class OneRoute:
    """A route registry that knows one route, `AMY_ROUTE`, and forgets nothing."""

    async def lookup(self, uids: Sequence[str]) -> dict[str, list[Route]]:
        return {"amy": [AMY_ROUTE]} if "amy" in uids else {}

    async def remove(self, routes: Iterable[Route]) -> None:
        pass


class OneRouteFleet:
    """A cached fleet (`router.fleet.cache.CachedFleet`'s calls) of one gateway, gw1, as
    old as `age_s`; it counts the times it was told to read the fleet again."""

    def __init__(self, age_s: float = 0.0) -> None:
        self._age_s = age_s
        self._live = [GatewayInfo("gw1", "g1", "ws://x", AMY_ROUTE.grpc_address, 1, 0)]
        self.invalidated = 0

    async def live(self) -> list[GatewayInfo]:
        return self._live

    def age(self) -> float:
        return self._age_s

    def invalidate(self) -> None:
        self.invalidated += 1


class MemoryDrainRequests:
    """Drain requests: gateway id -> the boot they are for."""

    def __init__(self) -> None:
        self.asked: dict[str, int] = {}
        self.taken: set[str] = set()  # asked, and seen by their gateway

    async def request(self, gateway_id: str, boot_ms: int) -> None:
        self.asked[gateway_id] = boot_ms
        self.taken.discard(gateway_id)

    async def request_unless_last(
        self, gateway_id: str, boot_ms: int, others: Mapping[str, int]
    ) -> bool:
        if all(self.asked.get(g) == boot for g, boot in others.items()):
            return False
        await self.request(gateway_id, boot_ms)
        return True

    async def take(self, gateway_id: str, boot_ms: int) -> bool:
        if self.asked.get(gateway_id) != boot_ms:
            self.asked.pop(gateway_id, None)
            self.taken.discard(gateway_id)
            return False
        if gateway_id in self.taken:
            return False
        self.taken.add(gateway_id)
        return True
