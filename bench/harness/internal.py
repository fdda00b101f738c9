"""The credential a benchmark's stack uses on the gateways' gRPC ports."""

from __future__ import annotations

import argparse
import secrets
import subprocess
import tempfile
from pathlib import Path

__all__ = ["INTERNAL_MODES", "add_internal_flag", "internal_credentials"]

INTERNAL_MODES = ("none", "token", "mtls")


def internal_credentials(env: dict[str, str], cond: dict[str, str], mode: str) -> None:
    """Put `mode`'s settings into the children's `env` (and `mode` into the run's
    conditions): nothing, a fresh IMROUTE_INTERNAL_TOKEN, or mTLS files made by
    scripts/grpc-certs."""
    cond["internal"] = mode
    if mode == "token":
        env["IMROUTE_INTERNAL_TOKEN"] = secrets.token_urlsafe(32)
    elif mode == "mtls":
        folder = tempfile.mkdtemp(prefix="imroute-bench-certs-")
        script = Path(__file__).resolve().parents[2] / "scripts" / "grpc-certs"
        subprocess.run([str(script), folder], check=True, stdout=subprocess.DEVNULL)
        env["IMROUTE_GRPC_TLS_CERT"] = f"{folder}/node.pem"
        env["IMROUTE_GRPC_TLS_KEY"] = f"{folder}/node.key"
        env["IMROUTE_GRPC_TLS_CA"] = f"{folder}/ca.pem"
    elif mode != "none":
        raise ValueError(f"internal credential {mode!r}: one of {', '.join(INTERNAL_MODES)}")


def add_internal_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--internal",
        choices=INTERNAL_MODES,
        default="token",
        help="the credential of the push service's gRPC calls: none, IMROUTE_INTERNAL_TOKEN "
        "(default, as imroute dev runs) or mTLS (scripts/grpc-certs)",
    )
