"""The operator commands against bad input and odd answers (an audit's findings): each
is a message naming the problem and an exit code, never a traceback or a secret."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from router.cli import main, remote
from router.cli.rest import ApiSettings, RemoteError, RestClient
from router.cli.wait import POLL_S, SETTLE_S, wait_for_job
from shared.clock import ManualClock
from tests.unit.scripted_http import Answer, Handler, scripted


@pytest.fixture
def answering(monkeypatch: pytest.MonkeyPatch) -> Callable[[Handler], list[httpx.Request]]:
    """The commands' REST client on httpx's mock transport, answering with `handler`."""

    def install(handler: Handler) -> list[httpx.Request]:
        seen: list[httpx.Request] = []

        def handle(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return handler(request)

        class Mocked(RestClient):
            def __init__(self, settings: ApiSettings, **options: Any) -> None:
                options.update(transport=httpx.MockTransport(handle), sleep=lambda _: None)
                super().__init__(settings, **options)

        monkeypatch.setattr(remote, "RestClient", Mocked)
        return seen

    return install


KEY = ["--api-key", "k" * 20]


@pytest.mark.parametrize("url", ["not a url", "http://[::1", "ftp://h/", "http://"])
def test_a_bad_api_url_is_exit_2_naming_the_flag(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: retried for 5 s then "cannot reach" (exit 1), or an httpx traceback."""
    assert remote.main(["status", "--api-url", url, *KEY]) == 2
    err = capsys.readouterr().err
    assert "--api-url" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("command", "body"),
    [
        (["status"], {}),
        (["status"], {"gateways": [{"gateway_id": "gw1"}]}),
        (["broadcast", "--online", "--content", "1"], {"status": "queued"}),
        (["push", "amy", "--content", "1"], {}),
    ],
)
def test_an_answer_without_what_the_command_reads_is_exit_1_saying_so(
    answering: Callable[[Handler], list[httpx.Request]],
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    body: Any,
) -> None:
    """Before: a KeyError traceback, or `push None: delivered 0` and exit 0."""
    answering(lambda _: httpx.Response(200, json=body))
    assert remote.main([*command, "--api-url", "http://push", *KEY]) == 1
    err = capsys.readouterr().err
    assert ("has no" in err or "not gateways" in err) and "Traceback" not in err


def test_a_job_answer_without_its_counts_is_exit_1(
    answering: Callable[[Handler], list[httpx.Request]], capsys: pytest.CaptureFixture[str]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(202, json={"push_id": "p1"})
        return httpx.Response(200, json={"push_id": "p1", "status": "running"})

    answering(handler)
    command = ["broadcast", "--online", "--content", "1", "--wait", "--api-url", "http://push"]
    assert remote.main([*command, *KEY]) == 1
    assert "the answer has no mode" in capsys.readouterr().err


def test_a_drained_gateway_id_is_one_path_segment(
    answering: Callable[[Handler], list[httpx.Request]],
) -> None:
    """Before: `drain 'gw1/drain?force=true#'` drained gw1 with force, unasked."""
    seen = answering(lambda _: httpx.Response(404, json={"error": "not_found"}))
    code = remote.main(["drain", "gw1/drain?force=true#", "--api-url", "http://push", *KEY])
    assert code == 1
    [request] = seen
    assert request.url.raw_path == b"/v1/gateways/gw1%2Fdrain%3Fforce%3Dtrue%23/drain"
    assert not request.url.query


@pytest.mark.parametrize("timeout", ["nan", "-1", "0"])
def test_a_wait_timeout_that_is_no_duration_is_exit_2(
    timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: nan waited for ever, -1 was taken."""
    command = ["broadcast", "--online", "--content", "1", "--wait", "--timeout", timeout]
    assert remote.main([*command, *KEY]) == 2
    assert "--timeout" in capsys.readouterr().err


def test_a_uid_file_that_is_not_text_is_exit_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a UnicodeDecodeError traceback."""
    binary = tmp_path / "uids.bin"
    binary.write_bytes(b"amy\n\xff\xfe\x00bob\n")
    assert remote.main(["multicast", "--file", str(binary), "--content", "1", *KEY]) == 2
    err = capsys.readouterr().err
    assert f"{binary}: not UTF-8 text (byte 4)" in err and "Traceback" not in err


def test_an_unreachable_url_is_said_without_its_password() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    settings = ApiSettings(api_url="http://bob:hunter2pw@127.0.0.1:1", api_key=SecretStr("k" * 20))
    api = RestClient(settings, httpx.MockTransport(refuse), sleep=lambda _: None)
    with pytest.raises(RemoteError) as raised:
        api.call("GET", "/v1/gateways")
    assert "hunter2pw" not in str(raised.value) and "bob:***@127.0.0.1:1" in str(raised.value)


def _timeouts(request: httpx.Request) -> set[float]:
    return set(request.extensions["timeout"].values())


@pytest.mark.parametrize(
    ("flags", "tries", "timeout_s"),
    [
        ([], 3, 10.0),  # the defaults: 2 retries, 10 s
        (["--request-timeout", "0.25", "--retries", "1"], 2, 0.25),
        (["--request-timeout", "3", "--retries", "0"], 1, 3.0),
    ],
)
def test_request_timeout_and_retries_are_flags_each_retry_said(
    answering: Callable[[Handler], list[httpx.Request]],
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    tries: int,
    timeout_s: float,
) -> None:
    """Before: no such flags (a try had 30 s, and 3 retries, a hung service 2 minutes)."""

    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    seen = answering(hang)
    assert remote.main(["status", "--api-url", "http://push", *KEY, *flags]) == 1
    assert len(seen) == tries and all(_timeouts(r) == {timeout_s} for r in seen)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == tries  # a line per retry, then the error
    assert all(f"(retry {i} of {tries - 1})" in err[i - 1] for i in range(1, tries))
    said = f"no answer within {timeout_s:g} s" + (f" ({tries} tries)" if tries > 1 else "")
    assert (
        err[-1]
        == f"imroute status: cannot reach the push service at http://push/v1/gateways: {said}"
    )


def test_a_push_waiting_for_acks_has_its_wait_on_top_of_the_request_timeout(
    answering: Callable[[Handler], list[httpx.Request]],
) -> None:
    """For its answer only: connecting and sending keep the request timeout."""
    body = {"push_id": "p1", "delivered": [], "offline": [], "queued": [], "failed": []}
    seen = answering(lambda _: httpx.Response(200, json=body))
    command = ["push", "amy", "--content", "1", "--wait-ack", "2500", "--request-timeout", "1"]
    assert remote.main([*command, "--api-url", "http://push", *KEY]) == 0
    [timeouts] = [r.extensions["timeout"] for r in seen]
    assert timeouts == {"connect": 1.0, "read": 3.5, "write": 1.0, "pool": 1.0}


def test_a_wait_goes_on_through_a_push_service_restart(
    answering: Callable[[Handler], list[httpx.Request]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: the first refused poll ended the follow (exit 1) though the job went on."""
    job = {
        "push_id": "p1",
        "mode": "broadcast",
        "recipients": 2,
        "online": 2,
        "offline": 0,
        "batches": 1,
        "delivered": 2,
        "acked": 0,
        "queued": 0,
        "failed_batches": 0,
    }
    answers: list[Answer] = [
        httpx.Response(202, json={"push_id": "p1"}),
        httpx.Response(200, json={**job, "status": "running", "published": 0}),
        None,  # refused: restarting
        None,
        httpx.Response(200, json={**job, "status": "done", "published": 1}),
        httpx.Response(200, json={**job, "status": "done", "published": 1}),  # settled
    ]

    handle, seen = scripted(answers)
    answering(handle)
    command = ["broadcast", "--online", "--content", "1", "--wait", "--json"]
    assert remote.main([*command, "--api-url", "http://push", *KEY]) == 0
    assert len(seen) == 6 and len(answers) == 1
    err = capsys.readouterr().err
    assert err.count("Connection refused") == 1 and "still following p1" in err
    assert "answers again" in err


def test_a_wait_ends_at_an_error_that_is_not_an_outage(
    answering: Callable[[Handler], list[httpx.Request]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    answers = [
        httpx.Response(202, json={"push_id": "p1"}),
        httpx.Response(200, content=b"<html>not the API</html>"),
    ]
    seen = answering(lambda _: answers.pop(0))
    command = ["broadcast", "--online", "--content", "1", "--wait", "--json"]
    assert remote.main([*command, "--api-url", "http://push", *KEY]) == 1
    assert len(seen) == 2 and "not JSON" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--request-timeout", "0"),
        ("--request-timeout", "-1"),
        ("--request-timeout", "nan"),
        ("--request-timeout", "inf"),
        ("--request-timeout", "1e300"),  # would overflow a socket's timeout
        ("--request-timeout", "soon"),
        ("--retries", "-1"),
        ("--retries", "1.5"),
        ("--retries", "11"),
    ],
)
def test_a_request_timeout_or_retries_that_is_no_count_is_exit_2_naming_it(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert remote.main(["status", flag, value, *KEY]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"imroute status: {flag}: ") and "Traceback" not in err


def test_db_and_users_read_only_the_directory_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad value of a setting they do not use (the token key, Redis's timeout) does not
    stop them; a bad directory URL does, named."""
    from router.cli import main

    monkeypatch.setenv("IMROUTE_SECRET", "short")
    monkeypatch.setenv("IMROUTE_REDIS_TIMEOUT_S", "never")
    monkeypatch.setenv("IMROUTE_DB_URL", f"sqlite+aiosqlite:///{tmp_path}/users.db")
    assert main(["db", "upgrade"]) == 0
    data = tmp_path / "users.jsonl"
    data.write_text('{"uid":"a"}\n')
    assert main(["users", "import", str(data)]) == 0
    assert "imported 1 users" in capsys.readouterr().out
    monkeypatch.setenv("IMROUTE_DB_URL", "mysql://nope")
    assert main(["db", "upgrade"]) == 2
    assert "IMROUTE_DB_URL" in capsys.readouterr().err


def test_a_wait_reads_a_done_job_until_the_gateways_reports_are_in(
    answering: Callable[[Handler], list[httpx.Request]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A job is done once published; the gateways report what they wrote after it.
    Before: the last line said `0 delivered` of a broadcast its users had got."""
    job = {"push_id": "p1", "mode": "broadcast", "status": "done", "recipients": 0,
           "offline": 0, "batches": 1, "published": 1, "acked": 0, "queued": 0,
           "failed_batches": 0}  # fmt: skip
    answers = [
        httpx.Response(202, json={"push_id": "p1"}),
        httpx.Response(200, json={**job, "online": 0, "delivered": 0}),
        httpx.Response(200, json={**job, "online": 2, "delivered": 2}),
        httpx.Response(200, json={**job, "online": 2, "delivered": 2}),
    ]
    seen = answering(lambda _: answers.pop(0))
    command = ["broadcast", "--online", "--content", "1", "--wait", "--api-url", "http://push"]
    assert remote.main([*command, *KEY]) == 0
    assert len(seen) == 4 and answers == []
    assert "2 delivered" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "audience"),
    [
        (["--all"], None),
        (["--online"], {"online": True}),
        (["--tags", "a,b"], {"tags_any": ["a", "b"]}),
    ],
)
def test_a_broadcast_names_its_audience_or_all(
    answering: Callable[[Handler], list[httpx.Request]],
    flags: list[str],
    audience: dict[str, Any] | None,
) -> None:
    """`--all` is the whole directory (the API's absent audience), asked for by name."""
    seen = answering(lambda _: httpx.Response(202, json={"push_id": "p1"}))
    command = ["broadcast", *flags, "--content", "1", "--api-url", "http://push", *KEY]
    assert remote.main(command) == 0
    [request] = seen
    assert json.loads(request.content).get("audience") == audience


@pytest.mark.parametrize("flags", [[], ["--all", "--online"], ["--tags", "a", "--all"]])
def test_a_broadcast_takes_exactly_one_audience(
    answering: Callable[[Handler], list[httpx.Request]],
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
) -> None:
    seen = answering(lambda _: httpx.Response(202, json={"push_id": "p1"}))
    assert remote.main(["broadcast", *flags, "--content", "1", *KEY]) == 2
    assert "--tags/--online/--all: give exactly one of them" in capsys.readouterr().err
    assert seen == []


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["push", "amy", "--bogus", "1"], "imroute push: unrecognized arguments: --bogus 1"),
        (["push"], "imroute push: the following arguments are required: UIDS"),
        (["drain"], "imroute drain: the following arguments are required: GATEWAY-ID"),
    ],
)
def test_a_flag_argparse_cannot_take_is_said_as_the_commands(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: argparse's message under the usage of `imroute` and its five commands."""
    assert remote.main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and f"(see: imroute {argv[0]} -h)" in err
    assert "usage:" not in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--bogus"], "imroute: --bogus is no option of imroute: name a command first"),
        (["-x", "push"], "imroute: -x is no option of imroute: name a command first"),
        ([], "imroute: no command given: name a command first"),
    ],
)
def test_a_flag_before_any_command_is_named(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: argparse's "the following arguments are required: command", which hid the
    mistyped flag."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "(see: imroute -h)" in err and "required" not in err


def test_a_uid_file_that_cannot_be_read_is_exit_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a bare `[Errno 2] No such file or directory: '...'`."""
    for path, why in [
        (tmp_path / "none.txt", "No such file or directory"),
        (tmp_path, "Is a directory"),
    ]:
        assert remote.main(["multicast", "--file", str(path), "--content", "1", *KEY]) == 2
        assert f"--file: {path}: {why}" in capsys.readouterr().err


def _follow(
    answers: Sequence[dict[str, Any] | None], progress: bool = False
) -> tuple[dict[str, Any], int]:
    """`wait_for_job` on these answers to its GETs (None: no connection), on a clock its
    sleeps move: the job it returned, and how many GETs it made."""
    handle, seen = scripted(
        [None if job is None else httpx.Response(200, json=job) for job in answers]
    )
    clock = ManualClock()  # its advance is the sleep
    settings = ApiSettings(api_url="http://push", api_key=SecretStr("k" * 20))
    with RestClient(settings, transport=httpx.MockTransport(handle), sleep=clock.advance) as api:
        job = wait_for_job(api, "p1", 600.0, progress, sleep=clock.advance, clock=clock.monotonic)
    return job, len(seen)


def _job(status: str = "done", **counts: int) -> dict[str, Any]:
    base = {"push_id": "p1", "mode": "broadcast", "status": status, "recipients": 0,
            "online": 0, "offline": 0, "batches": 1, "published": 1, "delivered": 0,
            "acked": 0, "queued": 0, "failed_batches": 0}  # fmt: skip
    return {**base, **counts}


def test_a_done_job_is_read_until_two_reads_agree_on_the_reports() -> None:
    job, reads = _follow([_job(), _job(online=2, delivered=2), _job(online=2, delivered=2)])
    assert (job["delivered"], reads) == (2, 3)


def test_a_failed_job_settles_as_a_done_one() -> None:
    job, reads = _follow([_job("failed"), _job("failed", delivered=1), _job("failed", delivered=1)])
    assert (job["status"], job["delivered"], reads) == ("failed", 1, 3)


def test_acks_coming_in_do_not_hold_the_wait() -> None:
    job, reads = _follow(
        [_job(delivered=2), _job(delivered=2, acked=1), _job(delivered=2, acked=2)]
    )
    assert (job["acked"], reads) == (1, 2)


def test_reports_that_keep_moving_are_read_for_settle_s_at_most() -> None:
    moving = [_job(delivered=n) for n in range(100)]
    job, reads = _follow(moving)
    assert reads == SETTLE_S / POLL_S + 1  # the first done read, then every POLL_S
    assert job["delivered"] == reads - 1


def test_a_read_that_fails_while_settling_ends_the_wait_with_the_last_one() -> None:
    job, reads = _follow([_job(delivered=1), None])
    assert (job["delivered"], reads) == (1, 2)


def test_the_bar_of_a_job_with_no_batches_says_0_of_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A broadcast to an empty directory. Before: "0/1 batches", one that never came."""
    _follow([_job(batches=0, published=0)] * 2, progress=True)
    err = capsys.readouterr().err
    assert "0/0 batches" in err and "0/1" not in err
