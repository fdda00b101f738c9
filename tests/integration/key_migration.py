"""What the tests of `imroute keys migrate` share: the old key names and writing under them."""

from __future__ import annotations

import hashlib

from router.directory.base import UserRecord
from router.directory.sql import SqlUserDirectory
from router.redis.client import RedisClient
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.models import Message
from tests.integration.procs import base_env, imroute
from tests.integration.recovery_helpers import write_legacy

__all__ = [
    "BRACED",
    "FAR",
    "HEXED",
    "LegacyKeys",
    "message",
    "migrate",
    "users",
    "write_old",
]

BRACED = "bob{corp}"
HEXED = hashlib.sha1(BRACED.encode()).hexdigest()
FAR = 2**41


class LegacyKeys(KeySchema):
    """The names before: a braced uid's keys under the bare tag of its SHA-1 hex."""

    def user_seq(self, uid: str) -> str:
        old = self.legacy_user_keys(uid)
        return old[0] if old else super().user_seq(uid)

    def user_log(self, uid: str) -> str:
        old = self.legacy_user_keys(uid)
        return old[1] if old else super().user_log(uid)

    def user_inbox(self, uid: str) -> str:
        old = self.legacy_user_keys(uid)
        return old[2] if old else super().user_inbox(uid)


def message(text: str) -> Message:
    now = SystemClock().now_ms()
    return Message(f"m-{text}", f"p-{text}", 0, "admin", f'"{text}"'.encode(), now)


async def write_old(redis: RedisClient, prefix: str, uid: str, *texts: str) -> None:
    """Queue messages for an offline `uid` as the version before wrote them: under the
    old names, and into an inbox of its own (`recovery_helpers.write_legacy`)."""
    keys = LegacyKeys(prefix)
    names = (keys.user_seq(uid), keys.user_log(uid), keys.user_inbox(uid))
    for text in texts:
        await write_legacy(redis, *names, message(text), FAR)


async def users(url: str, *uids: str) -> None:
    async with SqlUserDirectory.from_url(url, SystemClock()) as d:
        await d.upsert([UserRecord(u) for u in uids])


def migrate(redis_url: str, prefix: str, db_url: str, *flags: str) -> str:
    env = base_env(IMROUTE_REDIS_URL=redis_url, IMROUTE_REDIS_PREFIX=prefix, IMROUTE_DB_URL=db_url)
    done = imroute("keys", "migrate", *flags, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout
