"""URLs in messages and logs."""

from __future__ import annotations

import re

from shared.errors import ConfigError

__all__ = ["redact_url", "unreadable_url"]

# Query parameters whose value is a secret (libpq's, redis-py's and the usual others)
SECRET_PARAMS = frozenset(
    {"password", "pass", "passwd", "pwd", "sslpassword", "secret", "token", "key", "api_key"}
)
# An authority's end: where its path, query or fragment starts
_AUTHORITY_END = re.compile(r"[/?#]")
# "host:port": a colon that a port follows, which no password needs to be
_PORTED = re.compile(r"(?:\[[^\]]*\]|[^:@\[\]]*):\d*")


def redact_url(url: str) -> str:
    """`url` with its secrets replaced by ***, for messages and logs: the password of its
    userinfo, and the value of every query parameter that names one (`?password=`,
    `token=`, ...). A password holding a "/", "?" or "#" left unencoded ends the
    authority early: `user:pa` before it, which no host:port is, marks it, and what
    runs to the next "@" is hidden. Text that is no URL comes back as it is."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = _AUTHORITY_END.search(rest)
    authority = rest if end is None else rest[: end.start()]
    at = authority.rfind("@")
    if at == -1 and ":" in authority and not _PORTED.fullmatch(authority):
        at = rest.find("@", len(authority))  # a delimiter in the password cut it short
    if at != -1:
        user, colon, _ = rest[:at].partition(":")
        if colon:
            rest = f"{user}:***{rest[at:]}"
    query_at = rest.find("?")
    if query_at != -1:
        query, hash_, fragment = rest[query_at + 1 :].partition("#")
        pairs = []
        for pair in query.split("&"):
            name, eq, value = pair.partition("=")
            pairs.append(f"{name}=***" if eq and value and name.lower() in SECRET_PARAMS else pair)
        rest = f"{rest[: query_at + 1]}{'&'.join(pairs)}{hash_}{fragment}"
    return f"{scheme}://{rest}"


def unreadable_url(setting: str, url: str, exc: ValueError) -> ConfigError:
    """The error for a URL in `setting` that its client library could not read (`exc`).
    The library's words quote a piece of the URL ("Port could not be cast to integer
    value as 'Sup3r'", a password cut short by an unencoded "#"), so they are kept only
    for a URL that holds no secret."""
    shown = redact_url(url)
    if shown == url:
        return ConfigError(f"{setting}: {exc}")
    return ConfigError(
        f"{setting}: {shown} cannot be read as a URL (the reason is not shown: it may quote "
        "the password); a password holding '/', '?', '#' or '@' must be percent-encoded"
    )
