"""The URLs the client asks, and the subprotocols that carry its token (pure)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = [
    "TOKEN_SUBPROTOCOL_PREFIX",
    "WS_SUBPROTOCOL",
    "dispatch_url",
    "resume_url",
    "token_subprotocols",
    "ws_connect_url",
]

# What the gateway selects; the token rides beside it as `imroute.jwt.<token>`, never
# echoed, as the JS client sends it: a URL is logged by proxies and servers, a header
# seldom.
WS_SUBPROTOCOL = "imroute.v1"
TOKEN_SUBPROTOCOL_PREFIX = "imroute.jwt."


def dispatch_url(api_url: str) -> str:
    """`{api_url}/v1/dispatch`, whether or not api_url ends with a slash."""
    return f"{api_url.rstrip('/')}/v1/dispatch"


def resume_url(ws_url: str, since: str | None = None) -> str:
    """The gateway's URL with `since` (when there is a position) in its query, URL-
    encoded, and no `token` in it; the rest of a query already in ws_url is kept. The
    token goes in `token_subprotocols`."""
    return _gateway_url(ws_url, None, since)


def token_subprotocols(token: str) -> list[str]:
    """The Sec-WebSocket-Protocol offer that carries `token`: `imroute.v1` (selected)
    and `imroute.jwt.<token>`."""
    return [WS_SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX + token]


def ws_connect_url(ws_url: str, token: str, since: str | None = None) -> str:
    """The gateway's URL with `token` (and `since`, when there is a position) added to
    its query, URL-encoded; a query already in ws_url is kept. For a client that cannot
    set Sec-WebSocket-Protocol: the URL holds the token, which proxies log
    (`ImrouteClient` sends it as `token_subprotocols` and `resume_url`)."""
    return _gateway_url(ws_url, token, since)


def _gateway_url(ws_url: str, token: str | None, since: str | None) -> str:
    """`ws_url` with `token` and `since` (those given) ending its query, URL-encoded;
    any `token` or `since` it held dropped, the rest kept."""
    parts = urlsplit(ws_url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if k not in ("token", "since")]  # fmt: skip
    if token is not None:
        query.append(("token", token))
    if since is not None:
        query.append(("since", since))
    return urlunsplit(parts._replace(query=urlencode(query)))
