"""The stop graces nest: `imroute dev` waits longer for its push service than the push
service waits for its workers, which wait for their open requests, then their jobs. A
push service killed before it killed its workers left one holding the port."""

from __future__ import annotations

import math

import pytest

from push_service.http_server import requests_grace_s
from push_service.workers import stop_grace_s as workers_grace_s
from router.processes.devstack import stop_grace_s as dev_grace_s
from shared.settings import PushSettings


@pytest.mark.parametrize(
    ("deliver_s", "jobs_s"), [(2.0, 10.0), (0.1, 0.0), (2.5, 10.0), (60.0, 3600.0)]
)
def test_each_stop_waits_longer_than_the_one_below_it(deliver_s: float, jobs_s: float) -> None:
    settings = PushSettings.load(
        {
            "IMROUTE_DELIVER_TIMEOUT_S": str(deliver_s),
            "IMROUTE_JOB_SHUTDOWN_GRACE_S": str(jobs_s),
        }
    )
    # The longest request: a duplicate of a push waiting for its acks (5 s, 10 s), and a
    # second, in whole seconds as uvicorn takes it (so the workers' grace counts the same).
    assert requests_grace_s(settings) == math.ceil(deliver_s + 5 + 10 + 1)
    assert workers_grace_s(settings) > requests_grace_s(settings) + jobs_s
    assert dev_grace_s(deliver_s, jobs_s) > workers_grace_s(settings) + 1
