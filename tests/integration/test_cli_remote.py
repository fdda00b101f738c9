"""The operator's commands: `imroute push`, `multicast`, `broadcast`, `status`
and `drain`, run as real processes against a real push service process, real gateways,
Redis and WebSocket clients; their output, `--json`, their exit codes and their errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.conftest import ADMIN_KEY
from tests.integration.http_raw import push_service
from tests.integration.procs import imroute_at
from tests.integration.stack import client, gateway, recv_json

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


async def test_push_prints_what_became_of_each_recipient_and_json_with_json(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    with push_service(redis_url, prefix, tmp_path, IMROUTE_ADMIN_API_KEY=ADMIN_KEY) as (_, port):
        async with gateway(redis_url, prefix, "gw1", "g1") as gw, client(gw, "amy") as amy:
            code, out, err = await imroute_at(port, "push", "amy", "bob", "--content", '{"n":1}')
            assert code == 0, err
            assert "delivered 1 (amy)" in out and "queued 1 (bob)" in out, out
            assert (await recv_json(amy))["content"] == {"n": 1}

            code, out, err = await imroute_at(
                port, "push", "amy", "--content", '"two"', "--sender", "ops", "--json"
            )
            assert code == 0, err
            answer = json.loads(out)
            assert answer["delivered"] == ["amy"] and answer["push_id"]
            frame = await recv_json(amy)
            assert (frame["content"], frame["from"]) == ("two", "ops")
            assert frame["msg_id"] == answer["msg_id"]


async def test_bad_input_and_refusals_exit_non_zero_with_a_message_and_no_key(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    with push_service(redis_url, prefix, tmp_path, IMROUTE_ADMIN_API_KEY=ADMIN_KEY) as (_, port):
        # Not JSON: refused before anything is sent.
        code, _, err = await imroute_at(port, "push", "amy", "--content", "{nope")
        assert code == 2 and "--content: not JSON" in err, err
        code, _, err = await imroute_at(port, "push", "amy", "--content", "1", "--wait-ack", "x")
        assert code == 2 and "--wait-ack" in err, err
        code, _, err = await imroute_at(port, "push", "--content", "1")
        assert code == 2 and "UIDS" in err, err
        code, _, err = await imroute_at(port, "broadcast", "--content", "1")
        assert code == 2 and "exactly one" in err, err
        # The push service's own 422 names the field.
        code, _, err = await imroute_at(port, "push", "a", "a", "--content", "1")
        assert code == 1 and "422 invalid_request: body.to" in err, err
        # A wrong key: 401, the setting named, the key never printed.
        wrong = "wrong-key-0123456789abcdef"
        code, out, err = await imroute_at(port, "push", "amy", "--content", "1", key=wrong)
        assert code == 1 and "401" in err and "IMROUTE_API_KEY" in err, err
        assert wrong not in out + err
        code, _, err = await imroute_at(port, "status", key=None)
        assert code == 1 and "401" in err, err
        # Nothing listening there.
        code, _, err = await imroute_at(port, "status", "--api-url", "http://127.0.0.1:1")
        assert code == 1 and "cannot reach the push service at http://127.0.0.1:1" in err, err
        # A file that is not there.
        missing = str(tmp_path / "none.txt")
        code, _, err = await imroute_at(port, "multicast", "--file", missing, "--content", "1")
        assert code == 2 and "none.txt" in err, err


async def test_multicast_and_broadcast_wait_for_their_jobs(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    uids = tmp_path / "uids.txt"
    uids.write_text("amy\nbob\n\ncid\n")
    with push_service(redis_url, prefix, tmp_path, IMROUTE_ADMIN_API_KEY=ADMIN_KEY) as (_, port):
        async with (
            gateway(redis_url, prefix, "gw1", "g1") as gw,
            client(gw, "amy") as amy,
            client(gw, "bob") as bob,
        ):
            code, out, err = await imroute_at(
                port, "multicast", "--file", str(uids), "--content", '"m"', "--wait", "--json"
            )
            assert code == 0, err
            job = json.loads(out)
            assert job["status"] == "done" and job["mode"] == "multicast"
            assert (job["recipients"], job["online"], job["offline"]) == (3, 2, 1), job
            assert (job["delivered"], job["queued"]) == (2, 1), job
            assert (await recv_json(amy))["content"] == "m"
            assert (await recv_json(bob))["content"] == "m"

            code, out, err = await imroute_at(
                port, "broadcast", "--online", "--content", '"b"', "--wait"
            )
            assert code == 0, err
            assert out.startswith("broadcast ") and " done: " in out, out
            # What the gateway wrote, reported after the job's end: read by --wait too.
            assert " 2 delivered" in out, out
            assert (await recv_json(amy))["content"] == "b"
            assert (await recv_json(bob))["content"] == "b"

            # Without --wait: the job's id, at once.
            code, out, err = await imroute_at(
                port, "multicast", "--file", str(uids), "--content", "1"
            )
            assert code == 0 and out.startswith("accepted: "), (out, err)


async def test_status_shows_the_fleet_and_drain_takes_a_gateway_out(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    with push_service(
        redis_url, prefix, tmp_path, IMROUTE_ADMIN_API_KEY=ADMIN_KEY, IMROUTE_GATEWAY_CACHE_S="0"
    ) as (_, port):
        async with (
            gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=0.2) as gw1,
            gateway(redis_url, prefix, "gw2", "g1", heartbeat_s=0.2),
            client(gw1, "amy"),
        ):
            code, out, err = await imroute_at(port, "status")
            assert code == 0, err
            assert "gw1" in out and "gw2" in out and "g1" in out, out
            code, out, err = await imroute_at(port, "status", "--json")
            listed = {g["gateway_id"]: g for g in json.loads(out)["gateways"]}
            assert set(listed) == {"gw1", "gw2"} and listed["gw1"]["connections"] == 1

            # The drain takes the admin key; with only the API key it is refused.
            code, _, err = await imroute_at(port, "drain", "gw1", admin=None)
            assert code == 1 and "403" in err, err
            code, _, err = await imroute_at(port, "drain", "nope")
            assert code == 1 and "404" in err, err
            code, out, err = await imroute_at(port, "drain", "gw1")
            assert code == 0 and "draining: gw1" in out, err
            # The last gateway of its group that is not draining: the 409 guard.
            code, _, err = await imroute_at(port, "drain", "gw2")
            assert code == 1 and "409" in err, err

            async def draining() -> bool:
                _, out, _ = await imroute_at(port, "status", "--json")
                return any(g["draining"] for g in json.loads(out)["gateways"])

            for _ in range(50):  # it shows at its next heartbeat
                if await draining():
                    break
                await asyncio.sleep(0.2)
            assert await draining(), "gw1 never listed as draining"
            code, out, _ = await imroute_at(port, "status")
            assert "draining" in out, out
