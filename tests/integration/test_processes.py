"""imroute as a user runs it: the CLI, the gateway process, and `imroute dev`."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import grpc.aio
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect

from router.processes.ports import free_port_block
from router.processes.supervisor import alive, descendants
from shared.keys import KeySchema
from shared.proto import gateway_pb2
from shared.proto.gateway_service import GatewayStub
from tests.conftest import API_KEY, SECRET
from tests.integration.procs import (
    BIN,
    base_env,
    dev_started,
    gateway_env,
    imroute,
    read_until,
    running,
    ws_url_of,
)
from tests.integration.stack import ready, token
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


async def test_a_crashed_gateways_routes_expire(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    env = gateway_env(redis_url, prefix)
    argv = [
        str(BIN / "imroute"),
        "gateway",
        "--id",
        "gwc",
        "--group",
        "g1",
        "--ws-port",
        "0",
        "--grpc-port",
        "0",
        "--route-ttl",
        "2",
        "--heartbeat",
        "0.5",
    ]
    keys = KeySchema(prefix)
    with running(argv, env) as proc:
        async with connect(f"{await ws_url_of(proc)}?token={token('crashy')}"):
            await wait_for(
                lambda: redis.hlen(keys.route("crashy")), "crashy's route", 2.0, every=0.02
            )
            assert await redis.hlen(keys.route("crashy")) == 1
            assert await redis.zscore(keys.gateways(), "gwc") is not None
            proc.send_signal(signal.SIGKILL)  # no goodbye, no unregister
            proc.wait(5)
        # Still there right after the crash...
        assert await redis.hlen(keys.route("crashy")) == 1
        await asyncio.sleep(2.3)
        # ...and gone by itself within one route TTL; the fleet record too.
        assert await redis.exists(keys.route("crashy")) == 0
        assert await redis.exists(keys.gateway("gwc")) == 0


def test_token_command_and_its_errors() -> None:
    ok = imroute("token", "alice", "--ttl", "60", env=base_env(IMROUTE_SECRET=SECRET))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count(".") == 2
    missing = imroute("token", "alice", env=base_env())
    assert missing.returncode == 2
    assert "IMROUTE_SECRET" in missing.stderr


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["gateway"], {"IMROUTE_SECRET": SECRET, "IMROUTE_WS_PORT": "high"}, "IMROUTE_WS_PORT"),
        (["gateway"], {}, "IMROUTE_SECRET"),
        (["gateway", "--id", "bad|id"], {"IMROUTE_SECRET": SECRET}, "IMROUTE_GATEWAY_ID"),
        (["push-service"], {}, "IMROUTE_API_KEY"),
        (
            ["push-service"],
            {"IMROUTE_API_KEY": "k" * 20, "IMROUTE_REDIS_URL": "http://x"},
            "IMROUTE_REDIS_URL",
        ),
        (["dev", "--gateways", "0"], {}, "--gateways"),
        (["dev", "--port", "70000"], {}, "--port"),
        (["dev", "--port", "65000"], {}, "outside 1-65535"),
        (
            ["push-service"],
            {"IMROUTE_API_KEY": "k" * 20, "IMROUTE_REDIS_URL": "redis://h:notaport/0"},
            "IMROUTE_REDIS_URL",
        ),
        (["gateway", "--heartbeat", "0.0003"], {"IMROUTE_SECRET": SECRET}, "IMROUTE_HEARTBEAT_S"),
    ],
)
def test_bad_configuration_stops_with_a_message_naming_it(
    argv: list[str], env: dict[str, str], named: str
) -> None:
    result = imroute(*argv, env=base_env(**env), timeout=30)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert named in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_gateway_without_redis_fails_clearly() -> None:
    result = imroute(
        "gateway",
        "--ws-port",
        "0",
        "--grpc-port",
        "0",
        env=base_env(IMROUTE_SECRET=SECRET, IMROUTE_REDIS_URL="redis://:pw-hunter2@127.0.0.1:1/0"),
        timeout=30,
    )
    assert result.returncode == 1
    assert "IMROUTE_REDIS_URL" in result.stderr
    assert "pw-hunter2" not in result.stderr
    assert "Connection refused" in result.stderr, result.stderr  # why, in redis-py's words


def test_a_gateway_refused_by_redis_says_why(redis_url: str) -> None:
    """The Redis Cluster trial: a wrong password read "no Redis answers", the cause
    (authentication) said nowhere."""
    scheme, rest = redis_url.split("://", 1)
    if scheme == "unix":  # the embedded Redis: the password goes in the query
        url = f"unix://nobody@{rest}{'&' if '?' in rest else '?'}password=pw-hunter2"
    else:
        url = f"{scheme}://nobody:pw-hunter2@{rest}"
    result = imroute(
        "gateway", "--ws-port", "0", "--grpc-port", "0",
        env=base_env(IMROUTE_SECRET=SECRET, IMROUTE_REDIS_URL=url), timeout=30,
    )  # fmt: skip
    assert result.returncode == 1
    assert "invalid username-password pair" in result.stderr, result.stderr
    assert "pw-hunter2" not in result.stderr


@pytest.mark.parametrize("service", ["gateway", "push-service"])
def test_a_misspelled_setting_is_said_at_the_start(service: str) -> None:
    """Before: IMROUTE_ADVERTIZE_HOST was read as nothing, and said nothing."""
    env = base_env(
        IMROUTE_SECRET=SECRET,
        IMROUTE_API_KEY=API_KEY,
        # so that each stops at once: a gateway without Redis, a push service (which
        # waits for Redis) at a dispatch rule it does not know
        IMROUTE_REDIS_URL="redis://127.0.0.1:1/0",
        IMROUTE_DISPATCH_RULE="no-such-rule",
        IMROUTE_ADVERTIZE_HOST="10.0.0.1",
        IMROUTE_TEST_WORKERS="3",  # the test runner's own: no slip of a setting
    )
    argv = ["gateway", "--ws-port", "0", "--grpc-port", "0"] if service == "gateway" else [
        service, "--port", "0"]  # fmt: skip
    result = imroute(*argv, env=env, timeout=30)
    said = (
        "IMROUTE_ADVERTIZE_HOST is no setting of imroute, and is ignored: IMROUTE_ADVERTISE_HOST?"
    )
    assert said in result.stderr, result.stderr
    assert "IMROUTE_TEST_WORKERS" not in result.stderr


async def test_imroute_dev_serves_a_push_end_to_end_and_stops_cleanly(
    prefix: str, tmp_path: Path
) -> None:
    port = free_port_block([0, 1, 2, 1001, 1002])
    # No Redis answers at this URL, so dev must start (and stop) an embedded one.
    env = base_env(
        IMROUTE_REDIS_URL="redis://127.0.0.1:1/0",
        IMROUTE_REDIS_PREFIX=prefix,
        IMROUTE_DB_URL=f"sqlite+aiosqlite:///{tmp_path}/users.db",
    )
    argv = [str(BIN / "imroute"), "dev", "--port", str(port)]
    with running(argv, env) as dev:
        banner, key, admin, secret = dev_started(dev)
        assert "started an embedded one" in banner
        assert re.search(r"Redis: +unix://\S+ +\(embedded: stopped and removed with dev\)", banner)
        gateways = re.findall(r"(gw\d) group=(g\d) ws=(\S+)", banner)
        assert [(g, grp) for g, grp, _ in gateways] == [("gw1", "g1"), ("gw2", "g2")]
        # dev gave its children an internal token: its gateways take no call without it.
        grpc_address = re.search(r"gw1 .*grpc=(\S+)", banner)
        assert grpc_address, banner
        async with grpc.aio.insecure_channel(grpc_address.group(1)) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await GatewayStub(channel).DeliverMany(
                    gateway_pb2.DeliverManyRequest(batches=[gateway_pb2.Batch()]), timeout=5
                )
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        children = descendants(dev.pid)
        assert len(children) >= 4  # push service, two gateways, redis-server

        tok = subprocess.run(
            [str(BIN / "imroute"), "token", "alice"],
            env=base_env(IMROUTE_SECRET=secret),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        async with connect(f"{gateways[1][2]}?token={tok}") as ws:
            await ready(ws)
            body = None
            for _ in range(50):  # the route is written right after the handshake
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/push",
                    data=json.dumps({"to": ["alice"], "content": {"text": "hi"}}).encode(),
                    headers={
                        "Authorization": f"Bearer {key}",
                        "Content-Type": "application/json",
                    },
                )
                body = json.loads(
                    await asyncio.to_thread(lambda r=request: urllib.request.urlopen(r).read())
                )
                if body["delivered"]:
                    break
                await asyncio.sleep(0.05)
            assert body is not None and body["delivered"] == ["alice"]
            frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert frame["msg_id"] == body["msg_id"]
            assert frame["content"] == {"text": "hi"}

            # The directory was migrated by dev: a broadcast reaches alice too.
            def call(method: str, path: str, payload: object, as_key: str) -> dict[str, object]:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}{path}",
                    method=method,
                    data=json.dumps(payload).encode(),
                    headers={
                        "Authorization": f"Bearer {as_key}",
                        "Content-Type": "application/json",
                    },
                )
                with urllib.request.urlopen(request) as resp:
                    answer: dict[str, object] = json.loads(resp.read())
                    return answer

            users = {"users": [{"uid": "alice"}, {"uid": "bob"}]}
            with pytest.raises(urllib.error.HTTPError) as refused:  # the push key cannot
                await asyncio.to_thread(call, "PUT", "/v1/users", users, key)
            assert refused.value.code == 403
            assert await asyncio.to_thread(call, "PUT", "/v1/users", users, admin) == {
                "upserted": 2
            }
            accepted = await asyncio.to_thread(
                call, "POST", "/v1/broadcast", {"content": "all"}, key
            )
            frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert (frame["push_id"], frame["content"]) == (accepted["push_id"], "all")

        dev.send_signal(signal.SIGINT)
        assert dev.wait(20) == 0
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in children if alive(pid)], "orphans left behind"


async def test_kill_9_of_imroute_dev_leaves_no_orphans(prefix: str, tmp_path: Path) -> None:
    port = free_port_block([0, 1, 2, 1001, 1002])
    env = base_env(
        IMROUTE_REDIS_URL="redis://127.0.0.1:1/0",
        IMROUTE_REDIS_PREFIX=prefix,
        IMROUTE_DB_URL=f"sqlite+aiosqlite:///{tmp_path}/users.db",
    )
    with running([str(BIN / "imroute"), "dev", "--port", str(port)], env) as dev:
        banner = "\n".join(read_until(dev, "Ctrl-C stops everything", timeout=60))
        children = descendants(dev.pid)
        assert len(children) >= 4  # push service, two gateways, the embedded redis-server
        dev.send_signal(signal.SIGKILL)
        dev.wait(5)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    # A killed dev cannot remove its embedded Redis's folder: the test does.
    folder = re.search(r"started an embedded one at unix://(\S+)/redis\.sock", banner)
    if folder:
        shutil.rmtree(folder.group(1), ignore_errors=True)
    assert not [pid for pid in children if alive(pid)], "orphans left behind"


def test_db_upgrade_and_users_import_commands(tmp_path: Path) -> None:
    env = base_env(IMROUTE_DB_URL=f"sqlite+aiosqlite:///{tmp_path}/users.db")
    for _ in range(2):  # the second run is a no-op
        up = imroute("db", "upgrade", env=env)
        assert up.returncode == 0, up.stderr
        assert "up to date" in up.stdout
    data = tmp_path / "users.jsonl"
    data.write_text('{"uid":"a","tags":["vip"]}\nnot json\n{"tags":["x"]}\n{"uid":"b"}\n')
    imp = imroute("users", "import", str(data), env=env)
    assert imp.returncode == 0, imp.stderr
    assert "imported 2 users, skipped 2 bad lines" in imp.stdout
    assert f"{data}:2:" in imp.stderr and f"{data}:3:" in imp.stderr
    bad = imroute("users", "import", str(tmp_path / "x.xml"), env=env)
    assert bad.returncode == 2 and "x.xml" in bad.stderr


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        # Before: no Redis answered at the URL as a standalone client asked it, so dev
        # started an embedded Redis in the Cluster's place; then a child exited 2.
        (
            {"IMROUTE_REDIS_URL": "redis+cluster://127.0.0.1:1"},
            "IMROUTE_BUS_URL: required when IMROUTE_REDIS_URL is a Redis Cluster",
        ),
        # Before: exit 1, "gw1 exited with code 2", and a KeyboardInterrupt traceback.
        ({"IMROUTE_HEDGE_MAX_TOKENS": "9999"}, "IMROUTE_HEDGE_MAX_TOKENS"),
    ],
)
def test_imroute_dev_with_a_setting_its_children_refuse_is_exit_2_at_once(
    extra: dict[str, str], said: str
) -> None:
    dev = imroute("dev", "--port", "19790", env=base_env(**extra))
    assert dev.returncode == 2, dev.stderr
    assert said in dev.stderr and "Traceback" not in dev.stderr
    assert "embedded" not in dev.stdout + dev.stderr  # nothing was started


async def test_sigterm_drains_the_gateway_then_it_exits(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    env = gateway_env(redis_url, prefix, IMROUTE_DRAIN_WINDOW_S="0.5")
    argv = [str(BIN / "imroute"), "gateway", "--id", "gwt", "--group", "g1",
            "--ws-port", "0", "--grpc-port", "0"]  # fmt: skip
    keys = KeySchema(prefix)
    with running(argv, env) as proc:
        async with connect(f"{await ws_url_of(proc)}?token={token('tess')}") as ws:
            await ready(ws)
            await wait_for(lambda: redis.hlen(keys.route("tess")), "tess's route", 2.0, every=0.02)
            proc.send_signal(signal.SIGTERM)
            frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert frame == {"type": "reconnect", "reason": "drain"}
            await asyncio.wait_for(ws.wait_closed(), 5)
            assert ws.close_code == 4503
        # Its own lines say what it did (the Pub/Sub trial found none), and no library
        # line per client closed (401 lines for a drain of 400 clients).
        said = await asyncio.to_thread(read_until, proc, "gateway gwt stopped", 10)
        text = "\n".join(said)
        assert "draining: 1 client(s) told to reconnect elsewhere" in text, text
        assert "drained: every client closed" in text, text
        assert "connection closed" not in text, text
        assert await asyncio.to_thread(proc.wait, 10) == 0
    assert await redis.exists(keys.route("tess")) == 0
    assert await redis.exists(keys.gateway("gwt")) == 0
