"""Browsers on other origins (IMROUTE_CORS_ORIGINS): only the dispatch call and the
browser client answer them, only for the origins listed; a preflight that may not pass
is a JSON 403 naming why. (In a real browser: tests/browser/test_js_cors.py.)"""

from __future__ import annotations

import pytest

from shared.errors import ConfigError
from shared.settings import PushSettings
from tests.api.conftest import Api, Fakes, serve
from tests.conftest import API_KEY

pytestmark = pytest.mark.api

APP = "https://chat.example.com"
OTHER = "https://evil.example.net"
LISTED = {"cors_origins": f"{APP}, https://www.example.com"}


def _preflight(origin: str, method: str = "GET", headers: str = "authorization") -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": headers,
    }


async def test_a_listed_origins_preflight_of_dispatch_is_204_allowing_the_token(
    api: Api,
) -> None:
    async with api(**LISTED) as http:
        resp = await http.options("/v1/dispatch", headers=_preflight(APP))
    assert resp.status_code == 204, resp.text
    assert resp.headers["access-control-allow-origin"] == APP
    assert resp.headers["access-control-allow-headers"] == "Authorization"
    assert resp.headers["access-control-allow-methods"] == "GET"
    assert resp.headers["vary"] == "Origin"


@pytest.mark.parametrize(
    ("origin", "method", "headers", "said"),
    [
        (OTHER, "GET", "authorization", f"origin '{OTHER}' may not call /v1/dispatch"),
        (APP, "POST", "authorization", "takes GET from other origins, not POST"),
        (APP, "GET", "authorization, x-api-key", "not 'x-api-key'"),
    ],
)
async def test_a_preflight_that_may_not_pass_is_403_naming_why(
    api: Api, origin: str, method: str, headers: str, said: str
) -> None:
    async with api(**LISTED) as http:
        resp = await http.options("/v1/dispatch", headers=_preflight(origin, method, headers))
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"] == "forbidden" and said in resp.json()["detail"]
    assert "access-control-allow-origin" not in resp.headers


async def test_answers_to_a_listed_origin_name_it_a_refusal_too(api: Api) -> None:
    """The SDK must read a 401 (stop) apart from a 503 (ask again): both carry the
    origin, and Retry-After is exposed to the page."""
    async with api(**LISTED) as http:
        refused = await http.get(
            "/v1/dispatch", headers={"Origin": APP, "Authorization": "Bearer x.y.z"}
        )
        script = await http.get("/client/imroute.js", headers={"Origin": APP})
        unlisted = await http.get("/client/imroute.js", headers={"Origin": OTHER})
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == APP
    assert refused.headers["access-control-expose-headers"] == "Retry-After"
    assert script.status_code == 200 and script.headers["access-control-allow-origin"] == APP
    assert unlisted.status_code == 200 and "access-control-allow-origin" not in unlisted.headers


async def test_every_answer_of_the_client_paths_varies_by_origin(api: Api) -> None:
    """A cache (a CDN, the browser's own after a plain <script>) must not hand an answer
    without CORS headers to a page of an origin listed."""
    async with api(**LISTED) as http:
        for headers in ({}, {"Origin": OTHER}, {"Origin": APP}):
            script = await http.get("/client/imroute.js", headers=headers)
            assert script.headers.get("vary") == "Origin", (headers, script.headers)


@pytest.mark.parametrize("path", ["/v1/push", "/v1/gateways", "/v1/users"])
async def test_api_key_endpoints_never_answer_another_origin(api: Api, path: str) -> None:
    """A page must never hold an API key: no CORS header, no preflight, even for `*`."""
    async with api(cors_origins="*") as http:
        preflight = await http.options(path, headers=_preflight(APP, "POST"))
        answer = await http.get(path, headers={"Origin": APP, "Authorization": f"Bearer {API_KEY}"})
    assert "access-control-allow-origin" not in preflight.headers
    assert preflight.status_code != 204
    assert "access-control-allow-origin" not in answer.headers


async def test_any_origin_for_a_star(api: Api) -> None:
    async with api(cors_origins="*") as http:
        resp = await http.options("/v1/dispatch", headers=_preflight(OTHER))
    assert resp.status_code == 204 and resp.headers["access-control-allow-origin"] == OTHER


async def test_without_origins_listed_no_answer_names_another_origin(api: Api) -> None:
    async with api() as http:
        preflight = await http.options("/v1/dispatch", headers=_preflight(APP))
        answer = await http.get("/client/imroute.js", headers={"Origin": APP})
    assert preflight.status_code == 405
    assert "access-control-allow-origin" not in preflight.headers
    assert "access-control-allow-origin" not in answer.headers


@pytest.mark.parametrize(
    "value",
    ["chat.example.com", "https://chat.example.com/", "https://chat.example.com/app",
     "ftp://chat.example.com", "*, https://chat.example.com"],
)  # fmt: skip
def test_a_bad_origin_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        PushSettings.load({"IMROUTE_CORS_ORIGINS": value})
    said = str(caught.value)
    assert said.startswith("invalid configuration: IMROUTE_CORS_ORIGINS: ")
    assert said.count("IMROUTE_CORS_ORIGINS") == 1 and "Value error" not in said


def test_origins_are_read_with_commas_or_spaces_and_as_browsers_send_them() -> None:
    settings = PushSettings.load(
        {"IMROUTE_CORS_ORIGINS": " HTTPS://Chat.Example.com,http://[::1]:8000  http://h:80 "
         "https://s:443 https://t:80"}
    )  # fmt: skip
    # Browsers leave out a scheme's default port.
    assert settings.cors_origins == (
        "https://chat.example.com http://[::1]:8000 http://h https://s https://t:80"
    )


async def test_under_a_root_path_the_routed_path_is_judged(fakes: Fakes) -> None:
    """Served under uvicorn's --root-path, as behind a proxy's prefix."""
    async with serve(fakes, root_path="/push", **LISTED) as http:
        resp = await http.options("/push/v1/dispatch", headers=_preflight(APP))
    assert resp.status_code == 204 and resp.headers["access-control-allow-origin"] == APP
