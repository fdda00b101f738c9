"""imroute-client stands alone: it imports nothing of the server's packages."""

from __future__ import annotations

import re
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "imroute_client"
SERVER = ("shared", "router", "push_service", "socket_gateway", "bench", "tests")
IMPORT = re.compile(rf"^\s*(?:import|from)\s+({'|'.join(SERVER)})\b", re.MULTILINE)


def test_the_package_imports_no_server_package() -> None:
    files = sorted(SOURCE.rglob("*.py"))
    assert len(files) >= 8
    found = {
        str(f.relative_to(SOURCE)): IMPORT.findall(f.read_text(encoding="utf-8")) for f in files
    }
    assert not {f: names for f, names in found.items() if names}
