"""What a uid may be: one rule, checked at every way in (a client token's `sub` at the
gateway and at dispatch, the HTTP API, the user directory, the CLI).

A uid is 1-128 characters (code points) of valid Unicode, none of them:

- a control character (Unicode category Cc: U+0000-U+001F, U+007F-U+009F): NUL, which
  PostgreSQL text cannot hold, newlines that split a log line in two, the ESC that
  starts a terminal's escape sequence;
- a lone surrogate (Cs), which JSON's ``\\ud83d`` can carry and UTF-8 cannot;
- a line or paragraph separator (Zl, Zp: U+2028, U+2029), newlines to JavaScript and
  to many log viewers;
- a bidirectional control (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069), which
  reorders how a log, a terminal or the dashboard shows the text around it.

Other format characters (Cf) are allowed: the zero-width joiner holds emoji sequences
together and the zero-width non-joiner is part of Persian spelling. Braces are allowed
(`shared.keys` gives such a uid keys of its own).

A refusal is `InvalidUid`, naming the field and what is wrong, never echoing the uid;
each is counted (`REFUSED.total`, the push service's ``imroute_uids_refused``) and
logged at most once per 10 s.
"""

from __future__ import annotations

import logging
import re
from typing import TypeGuard

from shared.errors import InvalidUid
from shared.throttled import ThrottledLine

__all__ = ["MAX_UID_LEN", "REFUSED", "check_uid", "uid_problem", "valid_uid"]

log = logging.getLogger(__name__)

MAX_UID_LEN = 128

_FORBIDDEN = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"
)

# Refused uids, process-wide, with their throttled log line.
REFUSED = ThrottledLine(log, "refused %(n)d uid(s); the latest: %(field)s: %(problem)s")


def uid_problem(uid: object) -> str | None:
    """What is wrong with `uid` (a sentence that does not quote it), or None."""
    if valid_uid(uid):
        return None
    if not isinstance(uid, str):
        return "must be a string"
    if not 1 <= len(uid) <= MAX_UID_LEN:
        return f"must be 1-{MAX_UID_LEN} characters, got {len(uid)}"
    bad = _FORBIDDEN.search(uid)
    assert bad is not None
    code = ord(bad.group())
    if 0xD800 <= code <= 0xDFFF:
        return "must be valid Unicode (no lone surrogates)"
    return f"must not hold control characters: U+{code:04X} at character {bad.start() + 1}"


def valid_uid(uid: object) -> TypeGuard[str]:
    """Whether `uid` keeps the rule (nothing counted: for a fast path that falls back to
    `check_uid` for its answer)."""
    if not isinstance(uid, str) or not 0 < len(uid) <= MAX_UID_LEN:
        return False
    if uid.isascii():  # the common case: printable is all of ASCII but Cc, in C
        return uid.isprintable()
    return _FORBIDDEN.search(uid) is None


def check_uid(uid: object, field: str = "uid") -> str:
    """`uid`, if it keeps the rule; else InvalidUid naming `field`, counted and logged."""
    if valid_uid(uid):  # the common case, in one call: the push path checks every uid
        return uid
    problem = uid_problem(uid)
    assert problem is not None
    REFUSED.note(field=field, problem=problem)
    raise InvalidUid(field, problem)
