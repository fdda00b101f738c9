"""Headless Chromium for the browser tests (Debian's `chromium`, driven by Playwright's
Python package through `executable_path`; its own browser download is not used). Where
there is none, the tests skip, saying why."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def chromium_path() -> str | None:
    given = os.environ.get("IMROUTE_CHROMIUM")
    if given:
        return given
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium (apt-get install chromium, or set IMROUTE_CHROMIUM)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install playwright)")
    async with async_playwright() as p:
        launched = await p.chromium.launch(
            executable_path=path, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield launched
        finally:
            await launched.close()
