"""docker-compose.yml renders: every service is defined and the secrets are mandatory.

Uses `docker compose config` (Compose v2 plugin) or `docker-compose config` (v1);
no Docker engine is needed. Skips, naming what to install, when neither is present.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
API_KEY = "test-api-key-0123456789"
SECRET = "test-secret-0123456789abcdef-0123456789"
INTERNAL = "test-internal-token-0123456789abcdef"
# Variables the compose file interpolates; cleared so the caller's shell cannot leak in.
COMPOSE_VARS = (
    "IMROUTE_API_KEY",
    "IMROUTE_SECRET",
    "IMROUTE_INTERNAL_TOKEN",
    "IMROUTE_PUBLIC_HOST",
)
INSTALL_HINT = (
    "neither `docker compose` (the Compose v2 plugin) nor `docker-compose` (v1, "
    ">= 1.29) is available; install one, e.g. `apt-get install docker-compose-plugin` "
    "or `apt-get install docker-compose`"
)

try:
    import yaml  # PyYAML arrives with uvicorn[standard]; not a direct dependency.
except ImportError:  # pragma: no cover - depends on the environment
    yaml = None


@dataclass(frozen=True)
class Compose:
    argv: tuple[str, ...]
    v2: bool


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)


def _find_compose() -> Compose | str:
    """The Compose CLI to use, or why there is none."""
    if shutil.which("docker"):
        try:
            if _run(["docker", "compose", "version"]).returncode == 0:
                return Compose(("docker", "compose"), v2=True)
        except (OSError, subprocess.TimeoutExpired):
            pass
    exe = shutil.which("docker-compose")
    if exe is None:
        return INSTALL_HINT
    try:
        out = _run([exe, "version", "--short"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`docker-compose version` failed ({exc}); {INSTALL_HINT}"
    match = re.search(r"(\d+)\.(\d+)", out.stdout)
    if out.returncode != 0 or match is None:
        return f"`docker-compose version` failed: {out.stderr.strip()}; {INSTALL_HINT}"
    major, minor = int(match[1]), int(match[2])
    if major >= 2:  # the standalone v2 binary installed as docker-compose
        return Compose((exe,), v2=True)
    if (major, minor) < (1, 29):  # service_completed_successfully came in 1.29
        return f"docker-compose {match[0]} predates the Compose spec; {INSTALL_HINT}"
    return Compose((exe,), v2=False)


@pytest.fixture(scope="module")
def compose() -> Compose:
    found = _find_compose()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture
def empty_env_file(tmp_path: Path) -> Path:
    # A developer's .env beside the compose file must not satisfy the checks.
    path = tmp_path / "empty.env"
    path.write_text("")
    return path


def _config(
    compose: Compose, env_file: Path, extra_env: dict[str, str], *, json_out: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in COMPOSE_VARS}
    env.update(extra_env)
    argv = [
        *compose.argv,
        "--env-file",
        str(env_file),
        "-f",
        str(COMPOSE_FILE),
        "--project-directory",
        str(ROOT),
        "config",
    ]
    if json_out:
        argv += ["--format", "json"]
    return _run(argv, env=env)


def _rendered(compose: Compose, env_file: Path) -> dict[str, Any]:
    """The compose file as the tool renders it, with both secrets set."""
    if yaml is None and not compose.v2:
        pytest.skip("docker-compose v1 prints YAML only; install PyYAML to parse it")
    use_json = yaml is None
    proc = _config(
        compose,
        env_file,
        {"IMROUTE_API_KEY": API_KEY, "IMROUTE_SECRET": SECRET, "IMROUTE_INTERNAL_TOKEN": INTERNAL},
        json_out=use_json,
    )
    assert proc.returncode == 0, f"compose config failed:\n{proc.stderr}"
    doc = json.loads(proc.stdout) if use_json else yaml.safe_load(proc.stdout)
    assert isinstance(doc, dict), proc.stdout
    return doc


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # KEY=VALUE form
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]


def _flag(cmd: list[str], name: str) -> str | None:
    for i, arg in enumerate(cmd):
        if arg == name and i + 1 < len(cmd):
            return cmd[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _published(service: dict[str, Any]) -> set[str]:
    ports = set()
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            ports.add(str(port.get("published")))
        else:  # "HOST:CONTAINER" short syntax
            parts = str(port).split(":")
            ports.add(parts[-2] if len(parts) > 1 else parts[0])
    return ports


def test_compose_defines_every_service(compose: Compose, empty_env_file: Path) -> None:
    services: dict[str, Any] = _rendered(compose, empty_env_file)["services"]

    for name in ("redis", "postgres", "pubsub", "push-service"):
        assert name in services, f"service {name!r} missing; have {sorted(services)}"

    push = services["push-service"]
    assert _command(push)[:2] == ["imroute", "push-service"]
    assert _env(push).get("IMROUTE_API_KEY") == API_KEY
    assert _env(push).get("IMROUTE_INTERNAL_TOKEN") == INTERNAL
    assert "8080" in _published(push)
    for dep in ("redis", "postgres"):
        assert push["depends_on"][dep]["condition"] == "service_healthy"
    # Its dispatch checks client tokens: the gateways' secret.
    assert _env(push).get("IMROUTE_SECRET") == SECRET
    # The directory's tables first, on the push service's database.
    assert push["depends_on"]["db-upgrade"]["condition"] == "service_completed_successfully"
    upgrade = services["db-upgrade"]
    assert _command(upgrade)[:3] == ["imroute", "db", "upgrade"]
    assert _env(upgrade).get("IMROUTE_DB_URL") == _env(push).get("IMROUTE_DB_URL")
    bus = {k: _env(push).get(k) for k in ("IMROUTE_BUS_URL", "PUBSUB_EMULATOR_HOST")}
    assert bus["IMROUTE_BUS_URL"], bus

    groups: dict[str, list[str]] = {}
    ws_ports: dict[str, set[str]] = {}
    for name, svc in services.items():
        cmd = _command(svc)
        if cmd[:2] != ["imroute", "gateway"]:
            continue
        env = _env(svc)
        group = _flag(cmd, "--group") or env.get("IMROUTE_GROUP_ID")
        assert group, f"gateway {name!r} sets no group (--group or IMROUTE_GROUP_ID)"
        groups.setdefault(group, []).append(name)
        advertise = _flag(cmd, "--advertise-host") or env.get("IMROUTE_ADVERTISE_HOST")
        assert advertise == name, f"gateway {name!r} advertises {advertise!r}"
        assert env.get("IMROUTE_SECRET") == SECRET, f"gateway {name!r} lacks IMROUTE_SECRET"
        # One bus for every process (docs/operations/bus.md): else it hears no batch.
        theirs = {k: env.get(k) for k in bus}
        assert theirs == bus, f"gateway {name!r} is on another bus: {theirs} != {bus}"
        # Its gRPC port listens on the compose network: it must take the push service's token.
        assert env.get("IMROUTE_INTERNAL_TOKEN") == INTERNAL, f"gateway {name!r} takes any caller"
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
        ws_ports[name] = _published(svc)
        assert ws_ports[name], f"gateway {name!r} publishes no port"

    for group in ("g1", "g2"):
        assert len(groups.get(group, [])) >= 2, f"group {group}: {groups.get(group, [])}"
    all_ports = [p for ports in ws_ports.values() for p in ports]
    assert len(all_ports) == len(set(all_ports)), f"gateways share a host port: {ws_ports}"


def test_compose_requires_api_key(compose: Compose, empty_env_file: Path) -> None:
    proc = _config(
        compose, empty_env_file, {"IMROUTE_SECRET": SECRET, "IMROUTE_INTERNAL_TOKEN": INTERNAL}
    )
    assert proc.returncode != 0, "compose config accepted a missing IMROUTE_API_KEY"
    assert "IMROUTE_API_KEY" in proc.stderr + proc.stdout
    proc = _config(compose, empty_env_file, {"IMROUTE_SECRET": SECRET, "IMROUTE_API_KEY": API_KEY})
    assert proc.returncode != 0, "compose config accepted a missing IMROUTE_INTERNAL_TOKEN"
    assert "IMROUTE_INTERNAL_TOKEN" in proc.stderr + proc.stdout
