"""Where the client keeps the `pos` of the last push it processed.

The store is async, so it can live in the app's own database or cache; the client
awaits `save` once per processed push, and `load` once when it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["FilePosStore", "MemoryPosStore", "PosStore"]


@runtime_checkable
class PosStore(Protocol):
    """Keeps one position string (opaque, URL-safe, at most 256 characters)."""

    async def load(self) -> str | None:
        """The saved position, or None when there is none."""
        ...

    async def save(self, pos: str) -> None:
        """Replace the saved position."""
        ...


class MemoryPosStore:
    """In memory: a resume works across reconnects, not across process restarts."""

    __slots__ = ("pos",)

    def __init__(self, pos: str | None = None) -> None:
        self.pos = pos

    async def load(self) -> str | None:
        return self.pos

    async def save(self, pos: str) -> None:
        self.pos = pos


class FilePosStore:
    """In a file, written atomically (a temp file in the same folder, then os.replace),
    so a crash leaves the old position or the new one, never half of one. With `fsync`
    the data is flushed to disk before the rename (slower; survives a power cut)."""

    __slots__ = ("fsync", "path")

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync

    async def load(self) -> str | None:
        return await asyncio.to_thread(self._read)

    async def save(self, pos: str) -> None:
        await asyncio.to_thread(self._write, pos)

    def _read(self) -> str | None:
        try:
            text = self.path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return text or None

    def _write(self, pos: str) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(pos)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
