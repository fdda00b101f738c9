"""Push service: the FastAPI shell that callers use to push to users."""

from __future__ import annotations

from push_service.app import create_app

__all__ = ["create_app"]
