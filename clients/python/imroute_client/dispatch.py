"""`GET /v1/dispatch`: which gateway to connect to. Reading an answer is pure
(`read_dispatch`); `ask_dispatch` waits out 503s, 5xx and network errors."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from imroute_client.backoff import Backoff, retry_after
from imroute_client.errors import DispatchRefused, Unauthorized
from imroute_client.urls import dispatch_url

__all__ = ["Target", "ask_dispatch", "read_dispatch"]

log = logging.getLogger("imroute_client")


@dataclass(frozen=True, slots=True)
class Target:
    """A gateway dispatch chose."""

    ws_url: str
    gateway_id: str
    group_id: str


def read_dispatch(
    status: int, body: Any, retry_after_header: str | None, backoff: Backoff,
    rand: Callable[[], float],
) -> Target | float | None:  # fmt: skip
    """A Target; or seconds to wait (Retry-After) or None (use the backoff) before asking
    again; raises Unauthorized on 401 and DispatchRefused on a 4xx no retry fixes."""
    if status == 200:
        if isinstance(body, dict) and all(
            isinstance(body.get(k), str) for k in ("ws_url", "gateway_id", "group_id")
        ):
            return Target(body["ws_url"], body["gateway_id"], body["group_id"])
        return None  # not dispatch's answer (a proxy's page?): ask again later
    if status == 401:
        raise Unauthorized(f"dispatch refused the token (401: {str(body)[:200]})")
    if status in (429, 503) or status >= 500:
        return retry_after(retry_after_header, backoff, rand)
    raise DispatchRefused(f"dispatch answered {status}: {str(body)[:200]}")


async def ask_dispatch(
    http: httpx.AsyncClient,
    api_url: str,
    token: str,
    *,
    zone: str | None,
    backoff: Backoff,
    rand: Callable[[], float],
    errors: Counter[str],
    avoid: str | None = None,
) -> Target:
    """Ask until dispatch names a gateway; each failed ask is counted in `errors`.
    `avoid`: the gateway the client could not connect to (dispatch chooses another when
    it can, and counts it as a failed connect)."""
    params = {k: v for k, v in (("zone", zone), ("avoid", avoid)) if v is not None} or None
    url = dispatch_url(api_url)
    shown = str(httpx.URL(url).copy_with(userinfo=b""))  # a password in api_url: not logged
    attempt = 0
    while True:
        try:
            resp = await http.get(url, headers={"Authorization": f"Bearer {token}"},
                                  params=params)  # fmt: skip
        except httpx.HTTPError as exc:
            errors[type(exc).__name__] += 1
            failure = f"no answer ({type(exc).__name__})"
            wait = None
        else:
            try:
                body: Any = resp.json()
            except ValueError:
                body = resp.text
            answer = read_dispatch(
                resp.status_code, body, resp.headers.get("Retry-After"), backoff, rand
            )
            if isinstance(answer, Target):
                return answer
            errors[str(resp.status_code)] += 1
            failure = f"answered {resp.status_code}"
            wait = answer
        delay = backoff.delay(attempt, rand) if wait is None else wait
        # Said each time (the backoff spaces them), or a wrong api_url waits in silence.
        log.warning("dispatch at %s %s; asking again in %.1f s", shown, failure, delay)
        await asyncio.sleep(delay)
        attempt += 1
