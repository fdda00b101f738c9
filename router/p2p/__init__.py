"""The P2P path: a pure plan (recipients grouped by gateway, answers merged) and the
pusher that looks routes up and makes one Deliver call per gateway."""

from router.p2p.plan import DeliveryPlan, GatewayOutcome, PushOutcome, Target, merge, plan_p2p
from router.p2p.pusher import P2PPusher

__all__ = [
    "DeliveryPlan",
    "GatewayOutcome",
    "P2PPusher",
    "PushOutcome",
    "Target",
    "merge",
    "plan_p2p",
]
