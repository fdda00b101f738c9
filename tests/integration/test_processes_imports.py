"""The process tools start fast: importing the supervisor (which the push service's
workers, `imroute dev`, the benchmarks and the tests load) loads no HTTP server. The
import contracts forbid `push_service`, `fastapi` and `starlette` in `router`, but not
uvicorn; this checks what a fresh interpreter actually loads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

HTTP_SERVERS = ("uvicorn", "push_service", "starlette", "fastapi")


@pytest.mark.parametrize(
    "module",
    [
        "router.processes.supervisor",
        "router.processes.embedded_redis",
        "router.processes.ports",
        "router.processes.procs",
    ],
)
def test_importing_a_process_tool_loads_no_http_server(module: str) -> None:
    code = (
        f"import json, sys, {module}; "
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(json.loads(ran.stdout))
    assert not loaded & set(HTTP_SERVERS), sorted(loaded & set(HTTP_SERVERS))
