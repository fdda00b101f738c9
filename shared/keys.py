"""The Redis key schema: the one place that names every key imroute stores.

The gateway writes these keys and the router reads them, so both go through here. The
values' formats live with their stores: `router.routes.registry` for a route,
`router.fleet.codec` for a gateway record.

- ``{prefix}route:{uid}`` is a hash, one field per live connection of the user:
  ``conn_id -> "gateway_id|group_id|ip|port|expires_ms"``. Each field carries its own
  deadline (Redis 7.0 has no per-field TTL) and the key itself has a PEXPIRE that
  every register and heartbeat pushes forward, so a crashed gateway's routes stop
  counting at their deadline and vanish from Redis within one route TTL.
- ``{prefix}gw:{gateway_id}`` is the gateway's JSON record, with a PEXPIRE.
- ``{prefix}gateways`` is a sorted set, ``gateway_id`` scored by its record's deadline.
- ``{prefix}bus:{topic}`` is the Redis Streams bus's stream of one topic, and
  ``{prefix}bus-lost:{topic}`` a hash ``gateway_id -> n``: how many entries of that
  stream were trimmed (past ``IMROUTE_BUS_MAXLEN``) before that gateway had read them.
- ``{prefix}content:{msg_id}`` is a broadcast or multicast push's content, stored once
  for all its batches (which name it by msg_id), with a TTL.
- ``{prefix}useq:{<uid>}`` and ``{prefix}ulog:{<uid>}`` are a user's sequence (a hash:
  ``n`` the counter, ``e`` its epoch, the Redis clock in ms when the counter was created,
  `shared.positions`; ``a`` the last ``n`` one of the user's devices acked; ``f`` the
  last ``n`` the inbox bound pushed out of the inbox) and log (a
  list of ``<n> <ts> <entry>``, in order): the recovery log, and the inbox, which is the
  log after ``a``. ``{prefix}uinbox:{<uid>}`` is the inbox as the version before kept
  it (a sorted set scored by ``n``, the message again): read and acked until it lapses,
  no longer written. The braces are a Redis Cluster hash tag, so the three meet in one
  slot and one script; a
  uid holding a brace is tagged by its SHA-1 and named in full after it:
  ``{prefix}useq:{<sha1 hex of uid>}:<uid>`` (`_tag`: one name per uid, whatever it is).
  ``{prefix}useq:{<sha1 hex>}#quarantine`` (and ``ulog:``, ``uinbox:``) are the keys a
  braced uid and the uid that is its SHA-1 hex shared before, set aside by the key
  migration (`KeySchema.quarantined_user_keys`): no uid's keys are named so.
- ``{prefix}topicseq:{<topic>}`` and ``{prefix}topiclog:{<topic>}`` are a bus topic's
  batch sequence (the same hash) and batch log, hash-tagged by topic the same way.
- ``{prefix}{drain}:{gateway_id}`` asks that gateway to drain; its value is the boot
  (``started_ms``) it is for. ``{drain}`` is a literal hash tag: every drain request is
  in one slot, so the check that a group keeps a gateway not draining is one script.
- ``{prefix}{jobs}:job:{push_id}`` is a broadcast or multicast job's status hash; it
  expires a week after the job finished.
- ``{prefix}{jobs}:running`` is a sorted set of running jobs' push ids scored by the end
  of their lease; a job whose lease lapsed was orphaned by a dead push service.
- ``{prefix}{jobs}:recent`` is a sorted set of the latest jobs' push ids by creation
  time. ``{jobs}`` is a literal hash tag: every job's keys are in one slot, so a job's
  scripts (its creation among them), which move it in and out of the running set and
  the recent list, are atomic on Redis Cluster too.
- ``{prefix}{stats}:{bucket_ms}`` is the fleet's counts over one short interval (a
  hash), all in one slot (the tag ``{stats}``), so the dashboard's read of ten minutes
  of them is one node's pipeline.
- ``{prefix}rate:{bucket}`` is a rate limit's bucket (one per API key, named by a hash of
  the key): its GCRA theoretical arrival time in microseconds, expiring once the bucket
  is full again.
- ``{prefix}idem:{scope_hash}:{key_hash}`` is one Idempotency-Key's entry (a hash: the
  request's fingerprint, ``running`` with a lease or ``done`` with the answer), with a
  TTL. Both parts are SHA-256 hex digests: of the caller's API key (never stored) and of
  the header's value. One key per entry, so it is cluster-safe without a tag.
- ``{prefix}rcpt:{<push_id>}`` is a push's receipt (a hash: its counts, and for a
  listable push ``u:<uid> -> state`` per recipient); ``{prefix}rcpt-a:{<push_id>}`` and
  ``{prefix}rcpt-d:{<push_id>}`` are the HyperLogLogs of the acked and delivered uids of
  a counts-only one, and ``{prefix}rcpt-p:{<push_id>}`` the set of its recipients no
  device acked yet, kept until its message.unacked is due. Hash-tagged by push_id, so
  one script updates them all. A *slot-tagged* push id (`slot_tagged`:
  ``<32 hex>.<tag>``, a listable P2P push's) is tagged by its tag instead:
  ``{prefix}rcpt:{<tag>}<32 hex>``, in the Redis Cluster slot of its first recipient's
  keys (`KeySchema.user_slot_tag`).
- ``{prefix}unacked-due`` is a sorted set of push ids scored by when their
  ``message.unacked`` webhook event is due (a claimed one: when its lease ends).
- ``{prefix}{wh}:...`` are the webhooks' (docs/guides/webhooks.md), all in one hash slot
  (the literal tag ``{wh}``), so each of their scripts is atomic on Redis Cluster too:
  ``{wh}:events`` the outbox stream (field ``e``: one event's JSON; read by the consumer
  group ``senders``, deleted once delivered), ``{wh}:overflow`` a counter of events
  refused by a full outbox, ``{wh}:p:{uid}`` a user's presence hash (``e`` the epoch of
  its newest connection, ``r`` the epoch last reported offline), ``{wh}:due`` a sorted
  set of ``<epoch>:<uid>`` scored by when that user.offline is due (or checked again),
  ``{wh}:gw:{gateway_id}`` the set of users a gateway admitted (so a crashed gateway's
  users still get user.offline), and ``{wh}:gws`` the set of gateways that have one.
"""

from __future__ import annotations

import binascii
import hashlib
import itertools
import re
import string
from dataclasses import dataclass
from functools import cache

from shared.errors import InvalidInput

__all__ = [
    "ID_PATTERN",
    "KeySchema",
    "braced",
    "key_slot",
    "name_hash",
    "slot_tag",
    "slot_tagged",
    "validate_id",
]

# Gateway and group ids appear inside route values and key names.
ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def validate_id(field: str, value: str) -> str:
    """Return `value` if it is a valid gateway or group id, else raise InvalidInput."""
    if not ID_PATTERN.fullmatch(value):
        raise InvalidInput(field, "must be 1-64 characters of letters, digits, '_', '.' or '-'")
    return value


@dataclass(frozen=True, slots=True)
class KeySchema:
    """Key names under one prefix, so several stacks (or test runs) can share a Redis."""

    prefix: str = "imroute:"

    def route(self, uid: str) -> str:
        return f"{self.prefix}route:{uid}"

    def gateway(self, gateway_id: str) -> str:
        return f"{self.prefix}gw:{gateway_id}"

    def gateways(self) -> str:
        return f"{self.prefix}gateways"

    def drain(self, gateway_id: str) -> str:
        """Set (with a TTL) to ask a gateway to drain; it checks at every heartbeat. All in
        one hash slot (the tag ``{drain}``), so one script sees a whole group's."""
        return f"{self.prefix}{{drain}}:{gateway_id}"

    def bus_stream(self, topic: str) -> str:
        return f"{self.prefix}bus:{topic}"

    def bus_lost(self, topic: str) -> str:
        return f"{self.prefix}bus-lost:{topic}"

    def content(self, msg_id: str) -> str:
        return f"{self.prefix}content:{msg_id}"

    def user_seq(self, uid: str) -> str:
        return f"{self.prefix}useq:{_tag(uid)}"

    def user_log(self, uid: str) -> str:
        return f"{self.prefix}ulog:{_tag(uid)}"

    def user_inbox(self, uid: str) -> str:
        return f"{self.prefix}uinbox:{_tag(uid)}"

    def user_keys(self, uid: str) -> tuple[str, str, str]:
        """`user_seq`, `user_log` and `user_inbox` of `uid`, its tag worked out once."""
        return self._user_keys(_tag(uid))

    def user_slot_tag(self, uid: str) -> str:
        """The slot tag (`slot_tag`) of the Redis Cluster slot `uid`'s keys are in."""
        return slot_tag(key_slot(self.user_seq(uid)))

    def legacy_user_keys(self, uid: str) -> tuple[str, str, str] | None:
        """A braced uid's seq, log and inbox as they were named before `_tag` named them
        in full (None for a brace-free uid, whose names never changed): what the key
        migration (`router.recovery.retag`) moves from. Those names are also the keys of
        the brace-free uid that is the SHA-1 hex (`name_hash`)."""
        return self.user_keys(name_hash(uid)) if braced(uid) else None

    def quarantined_user_keys(self, hexed: str) -> tuple[str, str, str]:
        """Where the key migration sets aside the keys a braced uid shared with the uid
        `hexed`, its SHA-1 hex, when both are users: ``{<hexed>}#quarantine``, in their
        slot, and nobody's. After the tag's closing brace, the first in the name, a
        brace-free uid's name ends and a braced uid's goes on with ":"; this one goes
        on with "#"."""
        return self._user_keys("{" + hexed + "}#quarantine")

    def _user_keys(self, tag: str) -> tuple[str, str, str]:
        p = self.prefix
        return f"{p}useq:{tag}", f"{p}ulog:{tag}", f"{p}uinbox:{tag}"

    def topic_seq(self, topic: str) -> str:
        return f"{self.prefix}topicseq:{_tag(topic)}"

    def topic_log(self, topic: str) -> str:
        return f"{self.prefix}topiclog:{_tag(topic)}"

    def job(self, push_id: str) -> str:
        return f"{self.prefix}{{jobs}}:job:{push_id}"

    def jobs_running(self) -> str:
        return f"{self.prefix}{{jobs}}:running"

    def jobs_recent(self) -> str:
        """The latest push jobs by creation time (what the dashboard lists)."""
        return f"{self.prefix}{{jobs}}:recent"

    def stats(self, bucket_ms: int) -> str:
        """The fleet's counts over one short interval starting at `bucket_ms`."""
        return f"{self.prefix}{{stats}}:{bucket_ms}"

    def rate(self, bucket: str) -> str:
        return f"{self.prefix}rate:{bucket}"

    def idempotency(self, scope_hash: str, key_hash: str) -> str:
        return f"{self.prefix}idem:{scope_hash}:{key_hash}"

    def receipt(self, push_id: str) -> tuple[str, str, str, str]:
        """A push's receipt hash, its acked and delivered HyperLogLogs, and its set of
        recipients not acked yet (counts-only, while a message.unacked is due)."""
        tagged = slot_tagged(push_id)
        tag = "{" + push_id[33:] + "}" + push_id[:32] if tagged else _tag(push_id)
        p = self.prefix
        return f"{p}rcpt:{tag}", f"{p}rcpt-a:{tag}", f"{p}rcpt-d:{tag}", f"{p}rcpt-p:{tag}"

    def unacked_due(self) -> str:
        return f"{self.prefix}unacked-due"

    def webhook_events(self) -> str:
        return f"{self.prefix}{{wh}}:events"

    def webhook_overflow(self) -> str:
        return f"{self.prefix}{{wh}}:overflow"

    def offline_due(self) -> str:
        return f"{self.prefix}{{wh}}:due"

    def presence_gateways(self) -> str:
        return f"{self.prefix}{{wh}}:gws"

    def presence_prefix(self) -> str:
        """``presence_prefix() + uid`` is a user's presence hash (scripts build it)."""
        return f"{self.prefix}{{wh}}:p:"

    def gateway_users(self, gateway_id: str) -> str:
        return f"{self.prefix}{{wh}}:gw:{gateway_id}"


def _tag(name: str) -> str:
    """A user's (topic's, push's) part of its keys' names, one per name: `{name}`, a
    Redis Cluster hash tag, so the keys share a slot.

    A name holding a brace cannot be its own tag (the cluster would hash only the part
    up to its first `}`): it is tagged by its SHA-1 hex and named in full after the
    tag, `{<sha1 hex>}:<name>`. The two forms never meet: after the opening brace, a
    brace-free name's form holds one brace, its last character; a braced name's holds
    at least two. A braced name is in its own name, so no two braced names share one
    either (SHA-1 only picks the slot). The form before, a bare `{<sha1 hex>}`, was
    the tag of the user whose uid is that hex too (`KeySchema.legacy_user_keys`).
    """
    if braced(name):
        return "{" + name_hash(name) + "}:" + name
    return "{" + name + "}"


SLOTS = 16_384  # Redis Cluster's hash slots
_TAG_CHARS = string.digits + string.ascii_uppercase + string.ascii_lowercase
_SLOT_TAGGED = re.compile(r"[0-9a-f]{32}\.[0-9A-Za-z]{3}")


def key_slot(key: str) -> int:
    """The Redis Cluster slot of `key`: CRC16 of its hash tag (the text between its first
    `{` and the first `}` after it, when not empty), else of the whole key."""
    data = key.encode()
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return binascii.crc_hqx(data, 0) % SLOTS


@cache
def _slot_tags() -> tuple[str, ...]:
    """For each slot, the first 3-character tag of letters and digits (in `_TAG_CHARS`
    order) that hashes to it: all 16,384 slots are reached among the 238,328 tags (40 ms
    to build, once per process)."""
    tags = [""] * SLOTS
    left = SLOTS
    for chars in itertools.product(_TAG_CHARS, repeat=3):
        tag = "".join(chars)
        slot = binascii.crc_hqx(tag.encode(), 0) % SLOTS
        if not tags[slot]:
            tags[slot] = tag
            left -= 1
            if not left:
                break
    return tuple(tags)


def slot_tag(slot: int) -> str:
    """A 3-character hash tag whose keys are in `slot`: `{<tag>}` hashes there."""
    return _slot_tags()[slot]


def slot_tagged(push_id: str) -> bool:
    """Whether `push_id` is slot-tagged: ``<32 hex>.<3-character slot tag>``, the push id
    of a listable P2P push. Its receipt is in its tag's slot (its first recipient's), and
    derives each recipient's acked state from the recipient's acked position instead of
    being marked by the gateways (`router.receipts`)."""
    return len(push_id) == 36 and _SLOT_TAGGED.fullmatch(push_id) is not None


def braced(name: str) -> bool:
    """Whether `name` holds a brace, so cannot be its own hash tag (`_tag`)."""
    return "{" in name or "}" in name


def name_hash(name: str) -> str:
    """The SHA-1 hex of `name`'s UTF-8 bytes: a braced name's hash tag (`_tag`), and
    before, its whole tag: so the uid whose keys a braced uid's were."""
    return hashlib.sha1(name.encode()).hexdigest()
