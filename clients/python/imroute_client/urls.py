"""The URLs the client asks (pure)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["dispatch_url", "ws_connect_url"]


def dispatch_url(api_url: str) -> str:
    """`{api_url}/v1/dispatch`, whether or not api_url ends with a slash."""
    return f"{api_url.rstrip('/')}/v1/dispatch"


def ws_connect_url(ws_url: str, token: str, since: str | None = None) -> str:
    """The gateway's URL with `token` (and `since`, when there is a position) added to
    its query, URL-encoded; a query already in ws_url is kept."""
    parts = urlsplit(ws_url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if k not in ("token", "since")]  # fmt: skip
    query.append(("token", token))
    if since is not None:
        query.append(("since", since))
    return urlunsplit(parts._replace(query=urlencode(query)))
