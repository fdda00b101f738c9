"""How the gateway keeps the cycle collector off its connections, a mixin of
`shared.settings.Settings` (read as `IMROUTE_*` like any other field)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

__all__ = ["GcSettings"]


class GcSettings(BaseSettings):
    """See shared.gc_policy: the README's "Garbage collection" says why."""

    # every this many seconds the gateway moves what has lived that long (its
    # connections) out of the collector's sight (gc.freeze); 0: only at start-up
    gc_freeze_s: float = Field(5.0, ge=0, le=86_400)
    # every this many seconds it looks at everything once more (a full collection of
    # what was frozen, then freezes again), so the cycles closed connections left behind
    # are freed; 0: never (their memory stays until the process ends)
    gc_full_s: float = Field(900.0, ge=0, le=86_400)
