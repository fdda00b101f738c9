"""URLs in messages and logs."""

from __future__ import annotations

__all__ = ["redact_url"]

# Query parameters whose value is a secret (libpq's, redis-py's and the usual others)
SECRET_PARAMS = frozenset(
    {"password", "pass", "passwd", "pwd", "sslpassword", "secret", "token", "key", "api_key"}
)


def redact_url(url: str) -> str:
    """`url` with its secrets replaced by ***, for messages and logs: the password of its
    userinfo, found by the last "@" before the query (so a "/" or "#" a password holds
    unencoded does not hide it), and the value of every query parameter that names one
    (`?password=`, `token=`, ...). Text that is no URL comes back as it is."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    query_at = rest.find("?")
    at = rest.rfind("@", 0, len(rest) if query_at == -1 else query_at)
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
