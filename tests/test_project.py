"""Project-level checks: package boundaries, the committed generated code and pages, the
docs site."""

from __future__ import annotations

import filecmp
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from shared.proto import gateway_pb2, gateway_service

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
    """The committed gateway_pb2 code is what ./scripts/proto writes (and only that: the
    gRPC glue, shared/proto/gateway_service.py, is written by hand)."""
    result = subprocess.run(
        [str(ROOT / "scripts" / "proto"), str(tmp_path)],
        cwd=ROOT,
        env={"PYTHON": sys.executable, "PATH": f"{BIN}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    written = sorted(p.name for p in (tmp_path / "shared" / "proto").iterdir())
    assert written == ["gateway_pb2.py", "gateway_pb2.pyi"]
    for name in written:
        generated = tmp_path / "shared" / "proto" / name
        assert filecmp.cmp(generated, ROOT / "shared" / "proto" / name, shallow=False), (
            f"shared/proto/{name} is stale: run ./scripts/proto"
        )


def test_the_gateway_service_glue_matches_the_proto() -> None:
    """shared/proto/gateway_service.py's method table is the .proto's service (each unary
    method's name, request and reply message), and the stubs and the servicer have each
    method: an RPC added to gateway.proto without its glue fails here."""
    service = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"]
    assert service.full_name == gateway_service.SERVICE
    assert not any(m.client_streaming or m.server_streaming for m in service.methods)
    assert [
        (rpc.name, rpc.request.DESCRIPTOR.full_name, rpc.reply.DESCRIPTOR.full_name)
        for rpc in gateway_service.METHODS
    ] == [(m.name, m.input_type.full_name, m.output_type.full_name) for m in service.methods]
    for rpc in gateway_service.METHODS:
        assert rpc.path == f"/{service.full_name}/{rpc.name}"
        assert callable(getattr(gateway_service.GatewayServicer, rpc.name, None)), rpc.name
        for stub in (gateway_service.GatewayAsyncStub, gateway_service.GatewaySyncStub):
            assert rpc.name in stub.__slots__, (stub.__name__, rpc.name)


@pytest.mark.parametrize(
    ("script", "page"),
    [
        ("config_reference", "configuration.md"),  # from the settings classes
        ("http_reference", "http-api.md"),  # from the push service's OpenAPI document
    ],
)
def test_a_generated_reference_page_is_up_to_date(script: str, page: str, tmp_path: Path) -> None:
    """docs/reference/<page> is what ./scripts/<script> writes from the code (the
    configuration's script also refuses a setting without a description)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), str(tmp_path / page)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / page).read_text(encoding="utf-8") == (
        ROOT / "docs" / "reference" / page
    ).read_text(encoding="utf-8"), (
        f"docs/reference/{page} is stale: run .venv/bin/python scripts/{script}"
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


def test_the_docs_site_builds_without_a_warning(tmp_path: Path) -> None:
    """mkdocs build --strict: no broken link or anchor, no page left out of the
    navigation (but the dated benchmark history), no snippet that is not there."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").is_file()


def test_the_readme_fits_on_two_screens() -> None:
    """The README says what imroute is and where to read on; the rest is in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines"


def test_no_doc_or_comment_cites_a_tracker_issue() -> None:
    """Say what and why: a reader cannot look up "issue 12"."""
    cited = re.compile(r"\bissues? ?#?[0-9]+|\bissue-[0-9]+", re.IGNORECASE)
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    found = []
    for name in tracked:
        path = ROOT / name
        if path.suffix not in {".md", ".py", ".lua", ".js", ".sh", ".toml", ".yml", ".proto"}:
            continue
        if not path.is_file() or name.startswith("tests/test_project.py"):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if cited.search(line):
                found.append(f"{name}:{n}: {line.strip()[:80]}")
    assert not found, "\n".join(found[:40])


@pytest.mark.parametrize("page", ["README.md", "CONTRIBUTING.md"])
def test_every_link_of_a_root_page_leads_somewhere(page: str) -> None:
    """The README and CONTRIBUTING link into docs/ and the tree: each relative link is a
    file or folder that exists (mkdocs checks the links inside docs/)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    targets = [m.group(1) for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)]
    broken = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert targets and not broken, f"{page} links to what is not there: {broken}"
