"""What to do after a connection ends, or its handshake is refused: stop, retry the same
gateway, or ask dispatch for the next one, and after how long (pure; Ribbon's
retry-same / retry-next, on the client side)."""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass

from imroute_client.backoff import Backoff

__all__ = [
    "CLOSE_DRAIN",
    "CLOSE_FULL",
    "USER_CAP_REASON",
    "USER_CAP_WAIT_S",
    "Outcome",
    "RetryState",
    "Step",
    "classify",
    "classify_status",
    "next_step",
    "refusal_detail",
]

# A gateway refuses a bad token, a full gateway and a connect rate before the 101, with
# HTTP 401, 503 and 429; after it, a user over the per-user cap is closed 4429, and a
# drained connection 4503.
CLOSE_FULL = 4429
CLOSE_DRAIN = 4503
# The start of a 4429's reason when the user, not the gateway, is full: every gateway
# would refuse until one of the user's other connections closes.
USER_CAP_REASON = "too many connections for this user"
# The least wait before trying again after the per-user cap.
USER_CAP_WAIT_S = 5.0


class Outcome(enum.Enum):
    """How a connection (or an attempt at one) ended."""

    # drained (reconnect frame, 4503, HTTP 503), full (HTTP 503) or over a connect rate
    # (429): go elsewhere now
    MOVE = "move"
    TRANSPORT = "transport"  # refused, reset, timed out, or closed without a close frame
    CLOSED = "closed"  # any other close or handshake answer (1001, 1011, 1013, 404, ...)
    UNAUTHORIZED = "unauthorized"  # HTTP 401: stop for good
    # 4429 for the per-user cap: another gateway would refuse too; wait, then try again
    USER_CAP = "user_cap"


@dataclass(slots=True)
class RetryState:
    """Failures in a row (for the backoff) and tries on the same gateway (for retry-same)."""

    failures: int = 0
    same_tries: int = 0


@dataclass(frozen=True, slots=True)
class Step:
    """Reconnect after `delay_s`, through dispatch or to the same gateway."""

    dispatch: bool
    delay_s: float


def classify(close_code: int | None, told_to_reconnect: bool, reason: str = "") -> Outcome:
    """The outcome of a connection closed with `close_code` (None: no close frame)."""
    if close_code == CLOSE_FULL and reason.startswith(USER_CAP_REASON):
        return Outcome.USER_CAP
    if told_to_reconnect or close_code == CLOSE_DRAIN:
        return Outcome.MOVE
    if close_code is None:
        return Outcome.TRANSPORT
    return Outcome.CLOSED


def classify_status(status: int) -> Outcome:
    """The outcome of a handshake the gateway answered with HTTP `status`, not 101."""
    if status == 401:
        return Outcome.UNAUTHORIZED
    if status in (429, 503):
        return Outcome.MOVE
    return Outcome.CLOSED


def next_step(
    state: RetryState,
    outcome: Outcome,
    lived_s: float,
    *,
    retries_same: int,
    backoff: Backoff,
    stable_s: float,
    rand: Callable[[], float],
) -> Step:
    """The next attempt, updating `state`. A connection that lived `stable_s` starts the
    backoff over. A move goes at once unless the previous attempt failed too (a second
    move in a row waits). A transport error retries the same gateway `retries_same`
    times, then asks dispatch. UNAUTHORIZED is the caller's to raise."""
    if outcome is Outcome.UNAUTHORIZED:
        raise ValueError("a refused token (HTTP 401) is not retried")
    if lived_s >= stable_s:
        state.failures = 0
        state.same_tries = 0
    delay = backoff.delay(state.failures - 1, rand) if state.failures else 0.0
    state.failures += 1
    if outcome is Outcome.USER_CAP:
        # It clears only when another of the user's connections closes: never at once.
        state.same_tries = 0
        return Step(dispatch=True, delay_s=max(delay, USER_CAP_WAIT_S))
    if outcome is Outcome.MOVE:
        state.same_tries = 0
        return Step(dispatch=True, delay_s=delay)
    # Nothing tells the client the gateway is back: wait at least the first backoff.
    delay = max(delay, backoff.delay(0, rand))
    if outcome is Outcome.TRANSPORT and state.same_tries < retries_same:
        state.same_tries += 1
        return Step(dispatch=False, delay_s=delay)
    state.same_tries = 0
    return Step(dispatch=True, delay_s=delay)


def refusal_detail(body: bytes) -> str:
    """What a refused handshake's body says: its JSON `detail`, else its text's start."""
    try:
        answer = json.loads(body)
    except ValueError:
        return body[:200].decode(errors="replace").strip()
    detail = answer.get("detail") if isinstance(answer, dict) else None
    return detail[:200] if isinstance(detail, str) else str(answer)[:200]
