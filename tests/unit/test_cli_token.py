"""`imroute token` (router/cli/token.py): the claims the gateways check."""

from __future__ import annotations

import jwt
import pytest

from router.cli import main

SECRET = "s" * 32


def claims(out: str) -> dict[str, object]:
    decoded: dict[str, object] = jwt.decode(
        out.strip(), SECRET, algorithms=["HS256"], options={"verify_aud": False}
    )
    return decoded


def test_audience_and_issuer_come_from_the_settings_or_the_flags(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("IMROUTE_SECRET", SECRET)
    assert main(["token", "alice"]) == 0
    plain = claims(capsys.readouterr().out)
    assert plain["sub"] == "alice" and "aud" not in plain and "iss" not in plain
    monkeypatch.setenv("IMROUTE_JWT_AUDIENCE", "chat-app")
    monkeypatch.setenv("IMROUTE_JWT_ISSUER", "auth.example")
    assert main(["token", "alice"]) == 0
    c = claims(capsys.readouterr().out)
    assert (c["aud"], c["iss"]) == ("chat-app", "auth.example")
    assert main(["token", "alice", "--audience", "other", "--issuer", "me"]) == 0
    c = claims(capsys.readouterr().out)
    assert (c["aud"], c["iss"]) == ("other", "me")


def test_a_ttl_over_the_maximum_is_refused_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("IMROUTE_SECRET", SECRET)
    assert main(["token", "alice", "--ttl", "86401"]) == 2
    err = capsys.readouterr().err
    assert "--ttl" in err and "IMROUTE_JWT_MAX_TTL_S (86400)" in err
    monkeypatch.setenv("IMROUTE_JWT_MAX_TTL_S", "0")  # no maximum
    assert main(["token", "alice", "--ttl", "864000"]) == 0
    c = claims(capsys.readouterr().out)
    assert isinstance(c["exp"], int) and isinstance(c["iat"], int)
    assert c["exp"] - c["iat"] == 864000


def test_it_reads_only_the_token_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad value of a setting it does not use (the bus's, the webhook's) is not its
    concern: the processes that read them refuse it."""
    monkeypatch.setenv("IMROUTE_SECRET", SECRET)
    monkeypatch.setenv("IMROUTE_BUS_MAXLEN", "many")
    monkeypatch.setenv("IMROUTE_DB_URL", "mysql://nope")
    assert main(["token", "alice"]) == 0
    assert claims(capsys.readouterr().out)["sub"] == "alice"
    monkeypatch.setenv("IMROUTE_JWT_LEEWAY_S", "soon")  # its own: refused, named
    assert main(["token", "alice"]) == 2
    assert "IMROUTE_JWT_LEEWAY_S" in capsys.readouterr().err
