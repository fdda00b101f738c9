"""A resumable job's spec and checkpoint, as its record keeps them."""

from __future__ import annotations

import pytest

from router.jobs.base import Checkpoint, FailedBatch, PushCounters
from router.jobs.specs import BroadcastSpec, MulticastSpec
from shared.errors import InvalidInput
from shared.models import Message


def test_a_broadcast_spec_survives_its_record() -> None:
    spec = BroadcastSpec(
        Message("m1", "p1", 3, "admin", '{"t":"h\u00e9 \U0001f600"}'.encode(), 17),
        99,
        True,
        ("vip", "beta"),
        False,
        1000,
    )
    assert BroadcastSpec.from_json(spec.to_json()) == spec
    online = BroadcastSpec(spec.message, 0, False, None, True, 500)
    assert BroadcastSpec.from_json(online.to_json()) == online


def test_a_multicast_spec_survives_its_record() -> None:
    message = Message("m2", "p2", 0, "app", b'{"n":1}', 18)
    to = MulticastSpec(message, 0, True, False, ("alice", "b\u00f6b"), None, 1000, 250)
    assert MulticastSpec.from_json(to.to_json()) == to
    audience = MulticastSpec(message, 5, False, True, None, ("vip",), 500, 1000)
    assert MulticastSpec.from_json(audience.to_json()) == audience


@pytest.mark.parametrize("raw", ["", "[]", '{"kind":"multicast"}', '{"kind":"broadcast"}'])
def test_an_unreadable_spec_is_invalid_input(raw: str) -> None:
    with pytest.raises(InvalidInput, match="spec"):
        BroadcastSpec.from_json(raw)


def test_a_multicast_spec_names_its_recipients_one_way() -> None:
    spec = MulticastSpec(Message("m", "p", 0, "a", b"1", 1), 0, True, False, ("a",), None, 1, 1)
    raw = spec.to_json().decode()
    with pytest.raises(InvalidInput, match="not a multicast"):
        MulticastSpec.from_json(raw.replace('"multicast"', '"broadcast"'))
    both = raw.replace('"tags_any":null', '"tags_any":["x"]')
    neither = raw.replace('"to":["a"]', '"to":null')
    for wrong in (both, neither):
        assert wrong != raw
        with pytest.raises(InvalidInput, match="exactly one of to and tags_any"):
            MulticastSpec.from_json(wrong)
    with pytest.raises(InvalidInput, match="chunk 0"):
        MulticastSpec.from_json(raw.replace('"chunk":1', '"chunk":0'))


def test_a_checkpoint_keeps_its_counters_and_failed_batches() -> None:
    counters = PushCounters(recipients=5, batches=3, published=2, failed_batches=1)
    counters.failed.append(FailedBatch("broadcast", 1, "u1", "down"))
    back = Checkpoint.from_json(Checkpoint("u9", 3, counters).to_json())
    assert (back.after, back.pages) == ("u9", 3)
    assert back.counters == counters
    with pytest.raises(InvalidInput, match="checkpoint"):
        Checkpoint.from_json('{"after":null}')
