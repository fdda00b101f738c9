"""The processes' log configuration (shared.logs): httpx's request lines, which quote a
request's whole URL (a webhook's may carry its receiver's credentials), stay out at
every level."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from shared.logs import configure


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    names = ("httpx", "httpcore", "uvicorn", "uvicorn.error", "uvicorn.access")
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("level", ["debug", "info"])
async def test_a_webhook_url_s_credentials_are_not_logged_by_httpx(
    level: str, restored_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(level, "text", "push-service")
    url = "https://hooks:Hunter2Pw@receiver.example/imroute?code=AZ-FUNC-KEY-123"
    transport = httpx.MockTransport(lambda request: httpx.Response(200))
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.post(url, content=b"{}")).status_code == 200
    logging.getLogger("router.webhook").info("our own line")  # the level holds for ours
    err = capsys.readouterr().err
    assert "Hunter2Pw" not in err and "AZ-FUNC-KEY" not in err, err
    assert "our own line" in err
