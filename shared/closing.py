"""`async with` for anything that closes: the exit awaits its `close()`."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["ClosedOnExit"]


class ClosedOnExit:
    """`async with` that closes on the way out; a subclass writes `close()`."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
