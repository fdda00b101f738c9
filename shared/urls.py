"""URLs in messages and logs."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["redact_url"]


def redact_url(url: str) -> str:
    """`url` with its password replaced by ***, for messages and logs."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url
