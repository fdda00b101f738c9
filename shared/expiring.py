"""A bounded expiring map: entries kept until their deadline, within a count and a size.

Entries leave from the old end: expired ones as they are met, and young ones when the
count or the byte budget would be exceeded (counted in `evicted_early`: a caller that
keeps ids to drop repeats lets a repeat of such an id through). Insertion order is
taken for expiry order, which holds when every entry is kept about as long as the
others (a fixed window, or deadlines that follow the calls); an entry expired behind a
younger one is not returned, and leaves once it reaches the old end.

Pure: the monotonic clock is injected (`now`), sizes come from the caller's `size`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["ExpiringMap"]

K = TypeVar("K")
V = TypeVar("V")


@dataclass(slots=True, eq=False)
class ExpiringMap(Generic[K, V]):
    """At most `max_entries` entries and about `max_bytes` (each entry costing
    `size(key, value)`), each until `keep_s` after it was put."""

    now: Callable[[], float]
    size: Callable[[K, V], int]
    max_entries: int
    max_bytes: int
    _bytes: int = field(default=0, init=False, repr=False)
    # key -> (until, value)
    _entries: OrderedDict[K, tuple[float, V]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )
    # Entries dropped before their deadline, to respect the caps.
    evicted_early: int = field(default=0, init=False)

    def get(self, key: K) -> V | None:
        """The value of `key` if it is kept and not expired, else None."""
        entry = self._entries.get(key)
        if entry is None or self.now() >= entry[0]:
            return None
        return entry[1]

    def __contains__(self, key: K) -> bool:
        entry = self._entries.get(key)
        return entry is not None and self.now() < entry[0]

    def put(self, key: K, value: V, keep_s: float) -> None:
        """Keep `value` under `key` for `keep_s` from now (replacing what `key` held, and
        moving it to the young end), after making room for it."""
        now = self.now()
        size = self.size(key, value)
        self._make_room(now, size)
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= self.size(key, old[1])
        self._entries[key] = (now + keep_s, value)
        self._bytes += size

    def add(self, key: K, value: V, keep_s: float) -> bool:
        """Whether `key` was kept already (and not expired); if not, keep `value` under
        it for `keep_s` from now. Room is made either way (a seen-set's check)."""
        now = self.now()
        self._make_room(now, self.size(key, value))
        entry = self._entries.get(key)
        if entry is not None and now < entry[0]:
            return True
        if entry is not None:
            del self._entries[key]
            self._bytes -= self.size(key, entry[1])
        self._entries[key] = (now + keep_s, value)
        self._bytes += self.size(key, value)
        return False

    def _make_room(self, now: float, size: int) -> None:
        """Drop from the old end what expired, and what must go for `size` more bytes
        and one more entry to fit."""
        entries = self._entries
        while entries:
            oldest, (until, value) = next(iter(entries.items()))
            young = now < until
            if young and len(entries) < self.max_entries and self._bytes + size <= self.max_bytes:
                return
            del entries[oldest]
            self._bytes -= self.size(oldest, value)
            self.evicted_early += young

    @property
    def bytes(self) -> int:
        """About how many bytes the entries take (by `size`)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)
