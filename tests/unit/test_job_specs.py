"""A resumable job's spec and checkpoint, as its record keeps them."""

from __future__ import annotations

import pytest

from router.jobs.base import Checkpoint, FailedBatch, PushCounters
from router.jobs.specs import BroadcastSpec
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


@pytest.mark.parametrize("raw", ["", "[]", '{"kind":"multicast"}', '{"kind":"broadcast"}'])
def test_an_unreadable_spec_is_invalid_input(raw: str) -> None:
    with pytest.raises(InvalidInput, match="spec"):
        BroadcastSpec.from_json(raw)


def test_a_checkpoint_keeps_its_counters_and_failed_batches() -> None:
    counters = PushCounters(recipients=5, batches=3, published=2, failed_batches=1)
    counters.failed.append(FailedBatch("broadcast", 1, "u1", "down"))
    back = Checkpoint.from_json(Checkpoint("u9", 3, counters).to_json())
    assert (back.after, back.pages) == ("u9", 3)
    assert back.counters == counters
    with pytest.raises(InvalidInput, match="checkpoint"):
        Checkpoint.from_json('{"after":null}')
