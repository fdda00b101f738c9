"""The operator's commands, over the REST API: `imroute push`, `broadcast`, `multicast`,
`status` and `drain`.

Each command is a pydantic model, and pydantic-settings' CLI support makes its fields
the flags (`--content`, `--wait-ack`, `--json`, ...), with their help, types and errors,
from that one place. The connection options every command takes (`--api-url`,
`--api-key`, `--admin-api-key`) are the fields of `Connection`, and default to the
settings `router.cli.rest.ApiSettings` reads (`IMROUTE_API_URL`, ...); so are
`--request-timeout` and `--retries` (each try's deadline, and how often a try that got
no answer, a 429 or a 503 is made again: see `router.cli.rest`). pydantic-settings
rather than typer: it is already the source of every other setting, so a flag, its
environment variable and its check stay one field; and it is already a dependency.

Exit codes: 0 done; 1 the push service refused or failed it, or could not be reached
(or a job failed, or is still running past `--timeout`); 2 a bad flag or value, before
anything was sent.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, Field, PrivateAttr, SecretStr, ValidationError
from pydantic_settings import (
    BaseSettings,
    CliApp,
    CliPositionalArg,
    CliSubCommand,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    get_subcommand,
)

from router.cli import show
from router.cli.rest import (
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT_S,
    MAX_RETRIES,
    MAX_TIMEOUT_S,
    RETRIES,
    ApiSettings,
    RemoteError,
    RestClient,
    new_idempotency_key,
)
from router.cli.wait import wait_for_job
from shared.errors import ImrouteError, InvalidInput

__all__ = ["COMMANDS", "main"]

# Their names are also `router.cli.REMOTE` (dispatched there before other imports).

# What the commands read of an answer: one without them is not an imroute push service's
PUSH_FIELDS = ("push_id", "delivered", "offline", "queued", "failed")
# How pydantic-settings says argparse could not take the command line
CLI_PARSE_ERROR = "error parsing CLI: "
GATEWAY_FIELDS = frozenset({"gateway_id", "group_id", "connections", "ws_url"})

COMMANDS = {
    "push": "push one message to users now (POST /v1/push)",
    "broadcast": "push to users with tags, everyone online, or all (POST /v1/broadcast)",
    "multicast": "push to the uids in a file (POST /v1/multicast)",
    "status": "the live gateways, by group (GET /v1/gateways)",
    "drain": "drain a gateway: its clients move to others (admin key)",
}


class Connection(BaseModel):
    """What every command takes: where the push service is, its keys, the output."""

    api_url: str | None = Field(None, description="the push service [env: IMROUTE_API_URL]")
    api_key: SecretStr | None = Field(None, description="[env: IMROUTE_API_KEY]")
    admin_api_key: SecretStr | None = Field(None, description="[env: IMROUTE_ADMIN_API_KEY]")
    json_out: bool = Field(
        False, validation_alias=AliasChoices("json"), description="print the answer as JSON"
    )
    request_timeout: float = Field(
        DEFAULT_TIMEOUT_S,
        gt=0,
        le=MAX_TIMEOUT_S,
        allow_inf_nan=False,
        description="seconds each try has to connect, and between the bytes of its answer "
        "(push --wait-ack adds its wait)",
    )
    retries: int = Field(
        DEFAULT_RETRIES,
        ge=0,
        le=MAX_RETRIES,
        description="times a try that got no answer, a 429 or a 503 is made again (a GET, "
        "or a request with its Idempotency-Key); never one that got no connection",
    )

    def client(self, extra_s: float = 0.0) -> RestClient:
        """The REST client of these options; `extra_s`: seconds a try may wait longer for
        its answer (connecting keeps `--request-timeout`)."""
        given = self.model_dump(include={"api_url", "api_key", "admin_api_key"})
        command = type(self).__name__.lower()
        return RestClient(
            ApiSettings(**{k: v for k, v in given.items() if v is not None}),
            retries=dataclasses.replace(RETRIES, max_retries_same=self.retries),
            timeout_s=self.request_timeout,
            notify=lambda text: show.error(command, text),
            extra_read_s=extra_s,
        )


class _Content(Connection):
    content: str = Field(description="the message's content, as JSON")
    sender: str | None = Field(None, description="its `from` (default: admin)")
    ttl_s: int | None = Field(None, description="seconds it may wait for an offline user")
    idempotency_key: str | None = Field(
        None,
        description="the Idempotency-Key to send (default: a new one; the command's own "
        "retries reuse it, and a rerun with the same key is sent at most once)",
    )

    def key(self) -> str:
        return self.idempotency_key or new_idempotency_key()

    def message(self) -> dict[str, Any]:
        try:
            content = json.loads(self.content)
        except ValueError as exc:
            raise InvalidInput("--content", f"not JSON: {exc}") from None
        body: dict[str, Any] = {"content": content}
        if self.sender is not None:
            body["from"] = self.sender
        if self.ttl_s is not None:
            body["ttl_s"] = self.ttl_s
        return body


class _Job(_Content):
    wait: bool = Field(False, description="follow the job to its end, with a progress bar")
    timeout: float = Field(
        600.0, gt=0, allow_inf_nan=False, description="with --wait: give up after this many seconds"
    )

    def submit(self, path: str, fields: dict[str, Any]) -> int:
        """POST the job (the message and `fields`) to `path`, then follow it."""
        with self.client() as api:
            body = {**self.message(), **fields}
            accepted = api.call("POST", path, body, idempotency_key=self.key(), expect=("push_id",))
            return self.follow(api, accepted)

    def follow(self, api: RestClient, accepted: dict[str, Any]) -> int:
        if not self.wait:
            show.out(accepted, self.json_out, f"accepted: {accepted['push_id']}")
            return 0
        job = wait_for_job(api, accepted["push_id"], self.timeout, progress=not self.json_out)
        show.out(job, self.json_out, show.job_line(job))
        return 0 if job["status"] == "done" and not job["failed_batches"] else 1


class Push(_Content):
    """Push one message to users now (POST /v1/push)."""

    uids: CliPositionalArg[list[str]]
    wait_ack: int | None = Field(None, description="wait up to this many ms for their acks")

    def run(self) -> int:
        body = {"to": self.uids, **self.message()}
        if self.wait_ack is not None:
            body["wait_ack_ms"] = self.wait_ack
        with self.client(extra_s=max(self.wait_ack or 0, 0) / 1000) as api:
            answer = api.call(
                "POST", "/v1/push", body, idempotency_key=self.key(), expect=PUSH_FIELDS
            )
        show.out(answer, self.json_out, show.push_lines(answer))
        return 1 if answer.get("failed") else 0


class Broadcast(_Job):
    """Push to users with any of the tags, everyone online, or all (POST /v1/broadcast)."""

    tags: str | None = Field(None, description="comma-separated: users with any of them")
    online: bool = Field(False, description="everyone connected now")
    everyone: bool = Field(
        False,
        validation_alias=AliasChoices("all"),
        description="every user of the directory, online or not",
    )

    def run(self) -> int:
        # One of the three, named: a push to everyone is never what a forgotten flag means.
        tags = [t for t in (self.tags or "").split(",") if t]
        if [bool(tags), self.online, self.everyone].count(True) != 1:
            raise InvalidInput("--tags/--online/--all", "give exactly one of them")
        fields: dict[str, Any] = {}  # no audience: the whole directory
        if tags:
            fields["audience"] = {"tags_any": tags}
        elif self.online:
            fields["audience"] = {"online": True}
        return self.submit("/v1/broadcast", fields)


class Multicast(_Job):
    """Push to the uids in a file, one per line (POST /v1/multicast)."""

    file: Path = Field(description="the uids, one per line ('-': standard input)")

    def run(self) -> int:
        return self.submit("/v1/multicast", {"to": _read_uids(self.file)})


class Status(Connection):
    """The live gateways, by group (GET /v1/gateways)."""

    def run(self) -> int:
        with self.client() as api:
            answer = api.call("GET", "/v1/gateways", expect=("gateways",))
        gateways = answer["gateways"]
        if not isinstance(gateways, list) or not all(
            isinstance(g, dict) and g.keys() >= GATEWAY_FIELDS for g in gateways
        ):
            raise RemoteError(200, "GET /v1/gateways: the answer's gateways are not gateways")
        show.out(answer, self.json_out, show.fleet_table(gateways))
        return 0


class Drain(Connection):
    """Drain a gateway (admin key): its clients are told to reconnect elsewhere."""

    gateway_id: CliPositionalArg[str]
    force: bool = Field(False, description="even the last gateway of its group")

    def run(self) -> int:
        # Quoted: an id is one path segment (a "/", "?" or "#" in it would name another
        # endpoint, or add a query).
        gateway = urllib.parse.quote(self.gateway_id, safe="")
        path = f"/v1/gateways/{gateway}/drain" + ("?force=true" if self.force else "")
        with self.client() as api:
            answer = api.call("POST", path, admin=True)
        show.out(answer, self.json_out, f"draining: {self.gateway_id}")
        return 0


class Imroute(BaseSettings):
    """The operator commands of `imroute` (flags only: each command reads its settings
    through `ApiSettings`, not here)."""

    model_config = SettingsConfigDict(
        cli_prog_name="imroute",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_hide_none_type=True,
        # A flag argparse cannot parse is a SettingsError, said by `main` as the command's
        # (argparse's own would name the root parser and all its commands).
        cli_exit_on_error=False,
    )

    push: CliSubCommand[Push]
    broadcast: CliSubCommand[Broadcast]
    multicast: CliSubCommand[Multicast]
    status: CliSubCommand[Status]
    drain: CliSubCommand[Drain]
    _code: int = PrivateAttr(0)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)  # the command line (CliApp adds it) and nothing else

    def cli_cmd(self) -> None:
        command = get_subcommand(self)
        assert isinstance(command, Push | Broadcast | Multicast | Status | Drain)
        self._code = command.run()


def main(argv: Sequence[str]) -> int:
    """Run one operator command (`argv` starts with its name); its exit code."""
    try:
        return CliApp.run(Imroute, cli_args=list(argv))._code
    except SettingsError as exc:
        told = str(exc)
        if not told.startswith(CLI_PARSE_ERROR):
            raise  # not the command line's: a fault of ours, not a flag to correct
        show.error(argv[0], f"{told.removeprefix(CLI_PARSE_ERROR)} (see: imroute {argv[0]} -h)")
        return 2
    except ValidationError as exc:
        show.error(argv[0], "; ".join(_validation_lines(exc)))
        return 2
    except RemoteError as exc:
        show.error(argv[0], str(exc))
        return 1
    except (InvalidInput, OSError) as exc:
        show.error(argv[0], str(exc))
        return 2
    except ImrouteError as exc:
        show.error(argv[0], str(exc))
        return 1


def _read_uids(path: Path) -> list[str]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput("--file", f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InvalidInput("--file", f"{path}: {exc.strerror or exc}") from None
    uids = [line.strip() for line in text.splitlines() if line.strip()]
    if not uids:
        raise InvalidInput("--file", f"{path}: no uids in it")
    return uids


def _validation_lines(exc: ValidationError) -> list[str]:
    """`--wait-ack: Input should be a valid integer` (the loc's first part is the command)."""
    lines = []
    for e in exc.errors():
        name = str(e["loc"][-1]).replace("_", "-") if e["loc"] else "?"
        lines.append(f"--{name}: {e['msg']}")
    return lines
