"""The receiver's `verify` refuses every malformed X-Imroute-Signature with a
SignatureError, never another exception: a receiver that catches SignatureError (as the
webhooks page says) answers 400, not 500, whatever a client sends."""

from __future__ import annotations

import random

import pytest

from router.webhook.signing import MAX_HEADER_CHARS, SignatureError, sign, verify
from tests.readme import webhook_verified

SECRET = "whsec-0123456789abcdef"
BODY = b'{"events":[]}'
T = 1_800_000_000
GOOD = sign(SECRET, BODY, T).split(",")[1]  # "v1=<64 hex>"
HEX = GOOD[3:]

NASTY = [
    # empty, or parts missing
    "",
    ",",
    ",,,",
    " ",
    "\t",
    "=",
    "t",
    "t=",
    "v1=",
    f"t={T}",
    GOOD,
    f"t={T},v1=",
    f"t=,{GOOD}",
    f"t={T},{GOOD},",
    f",t={T},{GOOD}",
    f"t={T},{GOOD},garbage",
    f"t={T},,{GOOD}",
    # duplicate keys
    f"t={T},t={T},{GOOD}",
    f"t={T},t={T + 1},{GOOD}",
    # digits int() or isdigit() take but ASCII does not have
    f"t=\u00b2,{GOOD}",  # superscript two
    f"t=\u0661\u0668\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660,{GOOD}",  # Arabic-Indic
    f"t=\uff11\uff18\uff10\uff10\uff10\uff10\uff10\uff10\uff10\uff10,{GOOD}",  # fullwidth
    f"t=1_800_000_000,{GOOD}",
    # numbers that are not unix seconds
    f"t={'9' * 5000},{GOOD}",
    f"t={'1' * 4301},{GOOD}",
    f"t={'1' * 13},{GOOD}",
    f"t=0{T},{GOOD}",
    f"t=-{T},{GOOD}",
    f"t=+{T},{GOOD}",
    f"t={T}.5,{GOOD}",
    f"t=1.8e9,{GOOD}",
    f"t=0x6b49d200,{GOOD}",
    f"t=NaN,{GOOD}",
    # signatures that are not 64 lowercase hex digits
    f"t={T},v1={'g' * 64}",
    f"t={T},v1={HEX.upper()}",
    f"t={T},v1={HEX[:-1]}",
    f"t={T},v1={HEX}0",
    f"t={T},v1={HEX[:-1]}\u00e9",
    f"t={T},v1={HEX[:-1]}\u0660",
    f"t={T},v1={HEX} x",
    f"t={T},v1={'0' * 64},v1=zz",
    # whitespace and control characters where they do not belong
    f"t= {T},{GOOD}",
    f"t ={T},{GOOD}",
    f"t={T},\n{GOOD}",
    f"t={T}\r\n,{GOOD}",
    f"\u00a0t={T},{GOOD}",
    f"t={T}\x00,{GOOD}",
    f"t={T};{GOOD}",
    f"T={T},{GOOD}",
    f"t={T},V1={HEX}",
    # not text a header carries
    f"t={T},{GOOD},\ud800",
    # too long, even when the right parts are in it
    f"t={T}," + "x=y," * 300 + GOOD,
    f"t={T}," + ",".join([GOOD] * 16),
]


@pytest.mark.parametrize("header", NASTY, ids=range(len(NASTY)))
def test_every_malformed_header_is_a_signature_error(header: str) -> None:
    with pytest.raises(SignatureError):
        verify(SECRET, BODY, header, now_s=T)


@pytest.mark.parametrize(
    "header",
    [
        f"t={T},{GOOD}",
        f" t={T} ,\t{GOOD} ",  # spaces or tabs around a part
        f"{GOOD},t={T}",
        f"t={T},v0=anything,{GOOD}",  # another scheme's entry is ignored
        f"t={T},v1={'0' * 64},{GOOD}",  # any one of several v1 may match
    ],
)
def test_well_formed_headers_still_verify(header: str) -> None:
    assert verify(SECRET, BODY, header, now_s=T) == T


def test_the_length_bound_leaves_room_for_a_rotation() -> None:
    header = f"t={T}," + ",".join([f"v1={'0' * 64}"] * 12 + [GOOD])
    assert len(header) <= MAX_HEADER_CHARS
    assert verify(SECRET, BODY, header, now_s=T) == T


PIECES = [
    *"t=v1,0123456789abcdefABCDEF -+.;\t\r\n\x00",
    "\u00b2",
    "\u0663",
    "\uff11",
    "\u00e9",
    "\u00a0",
    "\ud800",
    "9" * 4400,
    ",t=",
    ",v1=",
    f"t={T}",
    GOOD,
]


def _mutated(rng: random.Random) -> str:
    header = list(rng.choice([f"t={T},{GOOD}", f"{GOOD},t={T}", ""]))
    for _ in range(rng.randint(1, 4)):
        at = rng.randint(0, len(header))
        match rng.randrange(3):
            case 0:
                header[at:at] = [rng.choice(PIECES)]
            case 1:
                header[at : at + 1] = [rng.choice(PIECES)]
            case _:
                del header[at : at + rng.randint(1, 8)]
    return "".join(header)


def test_mutated_headers_verify_or_raise_signature_error_only() -> None:
    rng = random.Random(20240613)
    outcomes = {"verified": 0, "refused": 0}
    for _ in range(20_000):
        header = _mutated(rng)
        try:
            assert verify(SECRET, BODY, header, now_s=T) == T
            outcomes["verified"] += 1
        except SignatureError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 15_000 and outcomes["verified"] > 0, outcomes


def test_the_readmes_receiver_refuses_what_verify_refuses() -> None:
    """The webhooks page's copy-paste receiver, run as the page prints it: it accepts a header
    exactly when `verify` does, on every header above and 20,000 mutations."""
    verified = webhook_verified(clock=lambda: T)
    stale = sign(SECRET, BODY, T - 301)
    other_body = sign(SECRET, b"{}", T)
    headers = [*NASTY, stale, other_body, None, f"t={T},{GOOD}", f" t={T} ,\t{GOOD} "]
    headers += [f"{GOOD},t={T}", f"t={T},v0=x,{GOOD}", f"t={T},v1={'0' * 64},{GOOD}"]
    rng = random.Random(20240614)
    headers += [_mutated(rng) for _ in range(20_000)]
    verdicts = {True: 0, False: 0}
    for header in headers:
        try:
            verify(SECRET, BODY, header, now_s=T)
            expected = True
        except SignatureError:
            expected = False
        assert verified(SECRET, BODY, header) is expected, header
        verdicts[expected] += 1
    assert verdicts[True] > 10 and verdicts[False] > 15_000, verdicts
