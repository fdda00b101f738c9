"""The REST API as the operator commands call it: where it is, its keys, one call.

The URL and keys are settings like every other (`IMROUTE_API_URL`, `IMROUTE_API_KEY`,
`IMROUTE_ADMIN_API_KEY`); a command's `--api-url` / `--api-key` / `--admin-api-key` win
over them. A key is sent as a Bearer header and never printed: an error names the key's
setting, not its value.
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.errors import ImrouteError

__all__ = ["DEFAULT_API_URL", "ApiSettings", "RemoteError", "RestClient"]

DEFAULT_API_URL = "http://127.0.0.1:8080"
TIMEOUT_S = 30.0


class ApiSettings(BaseSettings):
    """Where the push service is and the keys to call it with (from the environment)."""

    model_config = SettingsConfigDict(env_prefix="IMROUTE_", extra="ignore")

    api_url: str = DEFAULT_API_URL
    api_key: SecretStr | None = None
    admin_api_key: SecretStr | None = None


class RemoteError(ImrouteError):
    """A call the push service refused or could not be reached for; `status` 0: no answer."""

    def __init__(self, status: int, message: str, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class RestClient:
    def __init__(self, settings: ApiSettings, transport: httpx.BaseTransport | None = None):
        self._settings = settings
        self._http = httpx.Client(
            base_url=settings.api_url.rstrip("/"), timeout=TIMEOUT_S, transport=transport
        )

    def __enter__(self) -> RestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def call(self, method: str, path: str, body: Any = None, admin: bool = False) -> dict[str, Any]:
        """The answer's JSON object; RemoteError for a 4xx/5xx (with the server's own
        error and detail) or when the push service cannot be reached."""
        setting = "IMROUTE_ADMIN_API_KEY" if admin else "IMROUTE_API_KEY"
        key = self._settings.admin_api_key if admin else None
        key = key or self._settings.api_key  # without an admin key, the API key holds both
        headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}
        url = f"{self._settings.api_url.rstrip('/')}{path}"
        try:
            resp = self._http.request(method, path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise RemoteError(0, f"cannot reach the push service at {url}: {exc}") from None
        try:
            answer = resp.json()
        except ValueError:
            answer = None
        if resp.is_success and isinstance(answer, dict):
            return answer
        if resp.is_success:
            raise RemoteError(resp.status_code, f"{method} {path}: the answer is not JSON")
        raise RemoteError(resp.status_code, _describe(method, path, resp, answer, setting), answer)


def _describe(method: str, path: str, resp: httpx.Response, answer: Any, setting: str) -> str:
    """`POST /v1/push: 422 invalid_request: body.to: ...` from the server's JSON error."""
    text = f"{method} {path}: {resp.status_code}"
    if not isinstance(answer, dict):
        return f"{text} {resp.reason_phrase}"
    error = answer.get("error")
    if error:
        text += f" {error}"
    detail = answer.get("detail")
    if isinstance(detail, list):
        parts = [
            f"{d.get('field', '?')}: {d.get('message', '')}" if isinstance(d, dict) else str(d)
            for d in detail
        ]
        text += ": " + "; ".join(parts)
    elif detail:
        text += f": {detail}"
    if resp.status_code in (401, 403):
        text += f" (check {setting} or the command's key flag)"
    return text
