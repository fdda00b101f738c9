"""Project-level checks: package boundaries and the committed generated code."""

from __future__ import annotations

import filecmp
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_import_contracts_hold() -> None:
    """shared is a leaf; push_service and socket_gateway never import each other."""
    result = subprocess.run(
        [str(BIN / "lint-imports")], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_generated_protobuf_code_is_up_to_date(tmp_path: Path) -> None:
    """The committed gateway_pb2 and gateway_pb2_grpc code is what ./scripts/proto writes."""
    result = subprocess.run(
        [str(ROOT / "scripts" / "proto"), str(tmp_path)],
        cwd=ROOT,
        env={"PYTHON": sys.executable, "PATH": f"{BIN}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for name in (
        "gateway_pb2.py",
        "gateway_pb2.pyi",
        "gateway_pb2_grpc.py",
        "gateway_pb2_grpc.pyi",
    ):
        generated = tmp_path / "shared" / "proto" / name
        assert filecmp.cmp(generated, ROOT / "shared" / "proto" / name, shallow=False), (
            f"shared/proto/{name} is stale: run ./scripts/proto"
        )


def test_the_configuration_reference_is_up_to_date(tmp_path: Path) -> None:
    """docs/configuration.md is what ./scripts/config_reference writes from the settings
    classes (which also refuses a setting without a description)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "config_reference"), str(tmp_path / "c.md")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "c.md").read_text(encoding="utf-8") == (
        ROOT / "docs" / "configuration.md"
    ).read_text(encoding="utf-8"), (
        "docs/configuration.md is stale: run .venv/bin/python scripts/config_reference"
    )


def test_every_lua_script_is_shipped_in_the_wheel() -> None:
    """The stores read their `.lua` files at import: package-data lists every one."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    data: dict[str, list[str]] = config["tool"]["setuptools"]["package-data"]
    for package, patterns in data.items():
        shipped = {path for pattern in patterns for path in (ROOT / package).glob(pattern)}
        for path in (ROOT / package).rglob("*.lua"):
            assert path in shipped, f"{path.relative_to(ROOT)}: not in package-data"
    assert list((ROOT / "router").rglob("*.lua"))
