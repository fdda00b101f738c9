"""Message content: validated and encoded to JSON once, at the edge."""

from __future__ import annotations

import json
from typing import Any

from push_service.schemas import MAX_CONTENT_BYTES
from shared.errors import InvalidInput, PayloadTooLarge

__all__ = ["encode_content"]


def encode_content(content: Any) -> bytes:
    """The content as compact UTF-8 JSON, at most MAX_CONTENT_BYTES."""
    try:
        data = json.dumps(content, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise InvalidInput("content", "must be JSON (NaN and Infinity are not)") from None
    encoded = data.encode()
    if len(encoded) > MAX_CONTENT_BYTES:
        raise PayloadTooLarge(
            "content", f"{len(encoded)} bytes once encoded; the limit is {MAX_CONTENT_BYTES}"
        )
    return encoded
