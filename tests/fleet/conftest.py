"""The fleet tier runs only where network namespaces can be built (root, iproute2)."""

from __future__ import annotations

import functools

import pytest

from tests.fleet.netns import netns_unavailable


@functools.cache
def _why_not() -> str | None:
    return netns_unavailable()


@pytest.fixture(autouse=True)
def _netns_or_skip() -> None:
    if (reason := _why_not()) is not None:
        pytest.skip(reason)
