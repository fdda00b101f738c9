"""Request and response bodies of the HTTP API (pydantic lives at the HTTP edge only)."""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    StringConstraints,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from router.directory.base import MAX_TAG_LEN, text_problem
from router.jobs.base import Job, JobStatus
from shared.errors import InvalidUid
from shared.uids import MAX_UID_LEN, check_uid, valid_uid

__all__ = [
    "MAX_BATCH",
    "MAX_CONTENT_BYTES",
    "MAX_MSG_TYPE",
    "MAX_MULTICAST",
    "MAX_RECIPIENTS",
    "MAX_SENDER_LEN",
    "MAX_TTL_S",
    "MAX_USERS_PER_CALL",
    "MAX_WAIT_ACK_MS",
    "AcceptedOut",
    "Audience",
    "BroadcastIn",
    "FailedBatchOut",
    "GatewayError",
    "GatewayOut",
    "GatewaysOut",
    "JobOut",
    "MulticastIn",
    "PushBatchOut",
    "PushIn",
    "PushOut",
    "PushResultOut",
    "RouteOut",
    "UpsertedOut",
    "UserIn",
    "UserRouteOut",
    "UsersIn",
    "check_uid_value",
]

# The bounds of a push body, declared once for PushIn and the group pushes' bodies
# (POST /v1/push's hand check, push_service.fast_push, reads them from PushIn's fields).
MAX_RECIPIENTS = 1000
MAX_CONTENT_BYTES = 64 * 1024
MAX_MSG_TYPE = 2**31 - 1
MAX_SENDER_LEN = 128
MAX_TTL_S = 30 * 24 * 3600
MAX_WAIT_ACK_MS = 10_000


def check_uid_value(uid: str) -> str:
    """The uid rule (`shared.uids`) as a pydantic validator: its message, as a 422 names
    the field."""
    if valid_uid(uid):  # the common case without check_uid's frame (every uid of a push)
        return uid
    try:
        return check_uid(uid)
    except InvalidUid as exc:
        raise ValueError(exc.message) from None


# The one rule checks the length too (so each refusal is counted); the schema shows it.
Uid = Annotated[
    str,
    AfterValidator(check_uid_value),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": MAX_UID_LEN}),
]


class _PushFields(BaseModel):
    """What the body of every push (P2P, broadcast, multicast) says besides whom it is for."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    content: JsonValue
    msg_type: int = Field(0, ge=0, le=MAX_MSG_TYPE)
    sender: str = Field("admin", alias="from", min_length=1, max_length=MAX_SENDER_LEN)
    # P2P never buffers, so "high" changes nothing there; accepted on every push alike.
    priority: Literal["normal", "high"] = "normal"
    ttl_s: int | None = Field(None, ge=1, le=MAX_TTL_S)
    # false: at-most-once (typing indicators and the like): not logged for recovery,
    # not kept in any inbox
    store: StrictBool = True


class _P2PRecipients(BaseModel):
    """A P2P push's `to`: a base of its own so that it comes first in PushIn's fields."""

    to: list[Uid] = Field(min_length=1, max_length=MAX_RECIPIENTS)

    @field_validator("to")
    @classmethod
    def _unique(cls, to: list[str]) -> list[str]:
        if len(set(to)) != len(to):
            raise ValueError("uids must be unique")
        return to


# Pydantic orders a model's fields by its bases from the last: `to`, then the push's
# fields, then its own (the order of its schema and of its 422s' details).
class PushIn(_PushFields, _P2PRecipients):
    # wait up to this long for the recipients' devices to ack; the answer then lists
    # `acked` and `unacked` (it returns early once every online recipient acked)
    wait_ack_ms: int | None = Field(None, ge=0, le=MAX_WAIT_ACK_MS)


class GatewayError(BaseModel):
    gateway_id: str
    error: str


class PushOut(BaseModel):
    push_id: str
    msg_id: str
    delivered: list[str]
    offline: list[str]
    failed: list[str] = Field(
        description="recipients not delivered: every gateway of theirs failed, or their "
        "routes could not be read (`errors` says which)"
    )
    queued: list[str] = Field(
        description="offline or failed recipients whose message waits in their inbox"
    )
    errors: list[GatewayError]
    acked: list[str] | None = Field(
        None, description="with wait_ack_ms: recipients at least one device acked"
    )
    unacked: list[str] | None = Field(
        None, description="with wait_ack_ms: every other recipient (offline ones too)"
    )


MAX_BATCH = 1000  # messages in one POST /v1/push/batch


class PushResultOut(BaseModel):
    """One message's answer: what POST /v1/push would answer, with its status."""

    index: int
    status: int = Field(description="200, or the status POST /v1/push would have given it")
    # with status 200: the fields of PushOut
    push_id: str | None = None
    msg_id: str | None = None
    delivered: list[str] | None = None
    offline: list[str] | None = None
    failed: list[str] | None = None
    queued: list[str] | None = None
    errors: list[GatewayError] | None = None
    # with any other status: its error, as POST /v1/push gives it
    error: str | None = None
    detail: list[dict[str, str]] | str | None = Field(
        None, description="422: each field, named body.messages.<index>.<field>"
    )


class PushBatchOut(BaseModel):
    results: list[PushResultOut] = Field(description="one per message, in order")


class RouteOut(BaseModel):
    gateway_id: str
    group_id: str
    ip: str
    port: int


class UserRouteOut(BaseModel):
    uid: str
    online: bool
    routes: list[RouteOut]


class GatewayOut(BaseModel):
    gateway_id: str
    group_id: str
    ws_url: str
    grpc_address: str
    connections: int
    max_connections: int = Field(0, description="IMROUTE_GATEWAY_MAX_CONNECTIONS; 0: no limit")
    zone: str | None = Field(None, description="IMROUTE_ZONE, if it has one")
    draining: bool = Field(False, description="asked to drain: dispatch no longer picks it")
    started_ms: int = Field(0, description="when this run of the gateway started (ms)")


class GatewaysOut(BaseModel):
    gateways: list[GatewayOut]


class DispatchOut(BaseModel):
    ws_url: str
    gateway_id: str
    group_id: str


MAX_MULTICAST = 1_000_000
MAX_USERS_PER_CALL = 10_000


def _tag_value(value: str) -> str:
    """The directory's own rule for a tag (no NUL, no lone surrogate): a tag it would
    refuse is refused here, naming its field, not later by the job it would fail."""
    if problem := text_problem(value, MAX_TAG_LEN):
        raise ValueError(problem)
    return value


Tag = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_TAG_LEN), AfterValidator(_tag_value)
]


class Audience(BaseModel):
    """Who a broadcast reaches: users with any of the tags, or whoever is online."""

    model_config = ConfigDict(extra="forbid")

    tags_any: list[Tag] | None = Field(None, min_length=1, max_length=64)
    online: bool | None = None

    @model_validator(mode="after")
    def _one_key(self) -> Audience:
        chosen = [k for k in ("tags_any", "online") if getattr(self, k) is not None]
        if len(chosen) != 1:
            raise ValueError('give exactly one of "tags_any" or "online"')
        if self.online is False:
            raise ValueError('"online" may only be true')
        return self


class BroadcastIn(_PushFields):
    audience: Audience | None = None


class MulticastIn(_PushFields):
    to: list[Uid] | None = Field(None, min_length=1, max_length=MAX_MULTICAST)
    audience: Audience | None = None

    @model_validator(mode="after")
    def _recipients(self) -> MulticastIn:
        if (self.to is None) == (self.audience is None):
            raise ValueError('give exactly one of "to" or "audience"')
        if self.audience is not None and self.audience.online:
            raise ValueError('a multicast audience is "tags_any"; use /v1/broadcast for online')
        if self.to is not None and len(set(self.to)) != len(self.to):
            raise ValueError("uids in to must be unique")
        return self


class AcceptedOut(BaseModel):
    push_id: str


class FailedBatchOut(BaseModel):
    """A batch that could not be published after its retries."""

    topic: str
    uids: int
    after: str | None = Field(
        description="a broadcast page: the uid it starts after (null: the first page)"
    )
    error: str


def _job_fields() -> dict[str, Any]:
    """`Job`'s fields in its order, each required (a job's record has them all), typed as
    the API shows them: the status as a string enum, the failed batches as FailedBatchOut."""
    edge: dict[str, Any] = {
        "status": (Literal[tuple(s.value for s in JobStatus)], ...),
        "attempts": (
            int,
            Field(description="runs of the job: 1, plus one per take-over after its process died"),
        ),
        "failed": (list[FailedBatchOut], Field(description="the first 100 failed batches")),
    }
    hints = get_type_hints(Job)
    return {f.name: edge.get(f.name, (hints[f.name], ...)) for f in fields(Job)}


# A job's fields are `router.jobs.base.Job`'s, not restated here.
_JobFields = create_model("_JobFields", **_job_fields())


class JobOut(_JobFields):  # type: ignore[misc,valid-type]
    delivered: int = Field(0, description="recipients written to at least one connection")
    acked: int = Field(0, description="recipients at least one device acked")
    queued: int = Field(0, description="recipients not written anywhere yet")
    expired: int = Field(
        0,
        description="recipients never to be written: their ttl_s passed first, or a "
        "store:false push did not reach them (counted 10 s after its job ended)",
    )
    listable: bool = Field(False, description="whether /recipients can list them")


class P2PStatusOut(BaseModel):
    push_id: str
    mode: str
    status: Literal["done"]
    recipients: int
    online: int
    offline: int
    delivered: int
    acked: int
    queued: int
    expired: int
    listable: bool


class RecipientsOut(BaseModel):
    push_id: str
    state: Literal["acked", "unacked", "queued"]
    uids: list[str]
    cursor: str | None = Field(description="pass it as ?cursor= for the next page; null: last")


class UserIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uid: Uid
    tags: list[Tag] = Field(default_factory=list, max_length=32)


class UsersIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    users: list[UserIn] = Field(min_length=1, max_length=MAX_USERS_PER_CALL)


class UpsertedOut(BaseModel):
    upserted: int
