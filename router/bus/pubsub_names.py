"""Pure rules of the Pub/Sub transport: the project URL and resource names.

Pub/Sub topic and subscription ids are 3-255 characters of letters, digits and
`-_.~+%`, start with a letter, and never start with `goog`. imroute's names map onto
them injectively:

- the namespace is the key prefix without one trailing `:`, percent-encoded except
  for letters, digits and `-_.` (so `imroute:` becomes `imroute`, and a test prefix
  `imroute-test:ab12:` becomes `imroute-test%3Aab12`); a prefix without a trailing `:`
  gets a lone `%` at the end instead; one that would not start with a letter, or would
  start with `goog`, gets `x%%` in front (neither ever comes out of the encoding);
- a topic is `<namespace>~<topic>`: `imroute~broadcast`, `imroute~group.g1`;
- a gateway's subscription to it is `<namespace>~<topic>~<gateway id>`.

`~` never occurs in a topic or a gateway id (both are letters, digits and `_.-`), so no
two (topic, subscriber) pairs share a subscription.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from shared.errors import ConfigError, InvalidInput

__all__ = [
    "namespace",
    "parse_project",
    "subscription_id",
    "topic_id",
]

MAX_ID = 255
SEPARATOR = "~"

# A project id (6-30 lowercase letters, digits and hyphens, starting with a letter),
# optionally domain-scoped as `example.com:my-project`.
_PROJECT = re.compile(r"(?:[a-z0-9][a-z0-9.-]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")


def parse_project(url: str) -> str:
    """The project of a `pubsub://PROJECT` URL; ConfigError (naming it) otherwise."""
    scheme, sep, rest = url.partition("://")
    if scheme.lower() != "pubsub" or not sep:
        raise ConfigError("IMROUTE_BUS_URL: a Pub/Sub URL looks like pubsub://PROJECT")
    if not _PROJECT.fullmatch(rest):
        raise ConfigError(
            f"IMROUTE_BUS_URL: {rest!r} is not a Google Cloud project id "
            "(6-30 lowercase letters, digits or '-', starting with a letter): "
            "use pubsub://PROJECT"
        )
    return rest


def namespace(prefix: str) -> str:
    """The part of every Pub/Sub id that keeps one imroute stack apart from another."""
    # One trailing ':' (the usual "imroute:") is dropped; a prefix without one gets a
    # lone '%' instead, which percent-encoding never produces, so both stay distinct.
    if prefix.endswith(":"):
        ns = quote(prefix.removesuffix(":"), safe="-_.")
    else:
        ns = quote(prefix, safe="-_.") + "%"
    if not ns[:1].isascii() or not ns[:1].isalpha() or ns.lower().startswith("goog"):
        ns = "x%%" + ns  # '%%' never occurs in percent-encoded text either
    return ns


def topic_id(prefix: str, topic: str) -> str:
    """The Pub/Sub topic id of one imroute topic (`broadcast`, `group.<gid>`)."""
    return _checked(f"{namespace(prefix)}{SEPARATOR}{topic}")


def subscription_id(prefix: str, topic: str, subscriber: str) -> str:
    """The Pub/Sub subscription id of one gateway on one topic."""
    return _checked(f"{namespace(prefix)}{SEPARATOR}{topic}{SEPARATOR}{subscriber}")


def _checked(resource_id: str) -> str:
    if len(resource_id) > MAX_ID:
        raise InvalidInput(
            "topic",
            f"the Pub/Sub id {resource_id[:40]!r}... would be {len(resource_id)} characters "
            f"(at most {MAX_ID}): use a shorter key prefix, group id or gateway id",
        )
    return resource_id
