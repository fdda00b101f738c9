"""The websockets client logger the SDK connects with: no token in any record."""

from __future__ import annotations

import logging

import pytest
from imroute_client.logs import REDACTED, RedactedLog, redact

TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl"


def test_the_token_is_redacted_wherever_it_stands() -> None:
    assert redact(f"imroute.v1, imroute.jwt.{TOKEN}") == f"imroute.v1, {REDACTED}"
    assert redact(f"imroute.jwt.{TOKEN},imroute.v1") == f"{REDACTED},imroute.v1"
    assert redact(f"imroute.jwt.{TOKEN} imroute.jwt.x") == f"{REDACTED} {REDACTED}"
    assert redact("Host: h:1") == "Host: h:1"


def test_records_hold_the_redacted_text(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test_sdk_logs")
    log = RedactedLog(logger)
    with caplog.at_level(logging.DEBUG, logger="test_sdk_logs"):
        log.debug("> %s: %s", "Sec-WebSocket-Protocol", f"imroute.v1, imroute.jwt.{TOKEN}")
        log.info(f"offered imroute.jwt.{TOKEN}")
        log.debug("> %s", 42)
    texts = [r.getMessage() for r in caplog.records]
    assert texts == [
        f"> Sec-WebSocket-Protocol: imroute.v1, {REDACTED}",
        f"offered {REDACTED}",
        "> 42",
    ]
    assert all(TOKEN not in str(r.args) and TOKEN not in str(r.msg) for r in caplog.records)


def test_the_library_logger_by_default() -> None:
    assert RedactedLog().logger is logging.getLogger("websockets.client")
