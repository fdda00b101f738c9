"""The `websockets` client logger the SDK connects with: the token taken out.

At DEBUG the library logs the opening handshake's every header, and the offer in
Sec-WebSocket-Protocol carries the client token (`urls.token_subprotocols`), which a
debug log would then keep. This logger writes ``imroute.jwt.<redacted>`` in its place,
and everything else as the library wrote it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from imroute_client.urls import TOKEN_SUBPROTOCOL_PREFIX

__all__ = ["REDACTED", "RedactedLog", "redact"]

REDACTED = TOKEN_SUBPROTOCOL_PREFIX + "<redacted>"
# The token runs to the end of its offer: a comma, a space, or the end of the header.
_TOKEN = re.compile(re.escape(TOKEN_SUBPROTOCOL_PREFIX) + r"[^,\s]*")


def redact(text: str) -> str:
    """`text` with every `imroute.jwt.<token>` in it written `imroute.jwt.<redacted>`."""
    return _TOKEN.sub(REDACTED, text) if TOKEN_SUBPROTOCOL_PREFIX in text else text


class RedactedLog(logging.LoggerAdapter[logging.Logger]):
    """A logger (`websockets.client` by default) whose records never hold a token: a
    message's text and its string arguments are redacted before they are logged."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        super().__init__(logger or logging.getLogger("websockets.client"))

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        if isinstance(msg, str):
            msg = redact(msg)
        args = tuple(redact(a) if isinstance(a, str) else a for a in args)
        super().log(level, msg, *args, **kwargs)
