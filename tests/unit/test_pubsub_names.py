"""Pub/Sub resource names: valid for Pub/Sub, and distinct for distinct imroute names."""

from __future__ import annotations

import itertools
import re

import pytest

from router.bus.pubsub_names import namespace, parse_project, subscription_id, topic_id
from shared.errors import ConfigError, InvalidInput

# Pub/Sub's rule for topic and subscription ids.
VALID_ID = re.compile(r"[A-Za-z][-A-Za-z0-9_.~+%]{2,254}")


def test_the_default_prefix_gives_readable_names() -> None:
    assert topic_id("imroute:", "broadcast") == "imroute~broadcast"
    assert topic_id("imroute:", "group.g1") == "imroute~group.g1"
    assert subscription_id("imroute:", "group.g1", "gw-1") == "imroute~group.g1~gw-1"


@pytest.mark.parametrize(
    "prefix", ["imroute:", "imroute-test:ab12cd:", "1abc:", "goog:", "a b/c~d%e:", "é:", ":"]
)
def test_every_prefix_maps_onto_a_valid_id(prefix: str) -> None:
    for name in (
        topic_id(prefix, "broadcast"),
        topic_id(prefix, "group.g_1-x"),
        subscription_id(prefix, "broadcast", "gw.1"),
    ):
        assert VALID_ID.fullmatch(name), name
        assert not name.lower().startswith("goog")


def test_distinct_names_never_share_an_id() -> None:
    # Dots are legal in group and gateway ids, so a naive '.' join would collide here.
    pairs = [("group.a", "b.c"), ("group.a.b", "c"), ("broadcast", "x"), ("group.x", "x")]
    ids = {subscription_id("imroute:", t, s) for t, s in pairs}
    assert len(ids) == len(pairs)
    prefixes = [
        "a:", "a%3A:", "a~:", "a+:", "b:", "a", "a::", "1abc:", "x%%1abc:", "im-1abc:",
        "imroute:", ":", "", "goog:", "x%%goog:",
    ]  # fmt: skip
    spaces = {namespace(p) for p in prefixes}
    assert len(spaces) == len(prefixes)
    for p, q in itertools.combinations(prefixes, 2):
        assert topic_id(p, "broadcast") != topic_id(q, "broadcast")


def test_an_id_too_long_for_pubsub_is_refused_naming_the_way_out() -> None:
    with pytest.raises(InvalidInput, match="at most 255"):
        subscription_id("p" * 64 + ":", "group." + "g" * 64, "w" * 64 + "x" * 70)


@pytest.mark.parametrize(
    ("url", "project"),
    [
        ("pubsub://my-project", "my-project"),
        ("pubsub://example.com:proj-42", "example.com:proj-42"),
    ],
)
def test_project_urls(url: str, project: str) -> None:
    assert parse_project(url) == project


@pytest.mark.parametrize(
    "url", ["pubsub://", "pubsub://ab", "pubsub://My-Project", "pubsub://p/x", "redis://x", "x"]
)
def test_bad_project_urls_name_the_setting(url: str) -> None:
    with pytest.raises(ConfigError, match="IMROUTE_BUS_URL"):
        parse_project(url)
