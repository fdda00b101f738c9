"""The fleet tier: imroute on hosts in network namespaces (Redis, the push service, gw1
and gw2 in g1, gw3 in g2, and a clients host running SDK clients and a REST caller), one
fault per test while pushes go on. Each asserts, from the clients' own records, that
every push the API promised reached its user, none twice, and that the pushes the fault
touched arrived within the bound after the heal (tests/fleet/scenario.py). The figures
are printed, and recorded in docs/benchmarks/index.md.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fleet.fleet import Fleet
from tests.fleet.scenario import MOVE_BOUND_S, Load, run

pytestmark = [pytest.mark.integration, pytest.mark.fleet, pytest.mark.timeout(240)]


def cut(a: str, b: str) -> Callable[[Fleet], Callable[[], None]]:
    """A partition between hosts `a` and `b`, healed later."""

    def fault(f: Fleet) -> Callable[[], None]:
        f.net.partition(a, b)
        return lambda: f.net.heal(a, b)

    return fault


def test_a_gateway_cut_off_from_the_push_service(tmp_path: Path) -> None:
    run("gw1-push", tmp_path, cut("gw1", "push"), Load())


def test_a_gateway_cut_off_from_redis(tmp_path: Path) -> None:
    # Healed near the end of the load: a later push must not be what brings the ones
    # sent during the cut (it would, to a user who happens to get one).
    run("gw1-redis", tmp_path, cut("gw1", "redis"), Load(), heal_at_s=13.0)


def test_clients_cut_off_from_their_gateway_move_to_another(tmp_path: Path) -> None:
    # The cut outlasts the bound, which runs from the cut: gw1's clients must get their
    # pushes through gw2 (their group's other gateway), not by waiting for the heal.
    load = Load(duration_s=24.0)
    run("clients-gw1", tmp_path, cut("clients", "gw1"), load, heal_at_s=23.0,
        bound_from_fault=True, bound_s=MOVE_BOUND_S)  # fmt: skip


def test_the_only_gateway_of_a_group_sigkilled_during_multicasts(tmp_path: Path) -> None:
    def kill(f: Fleet) -> None:
        f.stop("gw3", signal.SIGKILL)

    load = Load(p2p_per_s=10, multicast_every_s=0.25, multicast_size=24)
    run("kill-gw3", tmp_path, kill, load)


def test_the_push_service_sigkilled_and_restarted(tmp_path: Path) -> None:
    """SIGKILLed under P2P, multicast and broadcast load, restarted 6 s later: the
    caller retries what got no answer with its Idempotency-Key until the restarted
    service answers (a key the dead process held waits out its lease, 5 s here, and runs
    again with the same msg_id), a job it was running is taken over, and every push
    accepted reaches its user once. The kill usually falls between requests and jobs
    (tests/integration/test_job_restarts.py kills mid-job, test_idempotency.py runs a
    job again under its key)."""

    def kill(f: Fleet) -> Callable[[], None]:
        f.stop("push", signal.SIGKILL)
        return f.start_push

    load = Load(p2p_per_s=30, multicast_every_s=0.5, broadcast_every_s=0.5)
    run("kill-push", tmp_path, kill, load, IMROUTE_IDEMPOTENCY_LEASE_S="5")


def test_redis_restarted_empty(tmp_path: Path) -> None:
    def restart(f: Fleet) -> None:
        f.restart_redis_empty()

    load = Load(p2p_per_s=10, multicast_every_s=1.0, broadcast_every_s=2.0)
    run("redis-empty", tmp_path, restart, load)


def test_a_redis_cluster_master_failover(tmp_path: Path) -> None:
    def fail_over(f: Fleet) -> None:
        assert f.cluster is not None
        f.cluster.fail_over(0)

    # The master killed holds the fleet's index of gateways (fleet:gateways, slot 3277).
    # P2P at 5/s: a later push to the same user must not be what brings the ones
    # answered during the failover (it would, to a user who happens to get one soon).
    # Multicasts and broadcasts too: their jobs, receipts and content live on the
    # Cluster (the bus on a Redis of its own).
    load = Load(p2p_per_s=5, multicast_every_s=1.0, broadcast_every_s=2.0)
    run("cluster-failover", tmp_path, fail_over, load, cluster=True)
