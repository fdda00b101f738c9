"""What the push service says at its start of settings that will not do what their
setter meant (push_service.__main__.start_warnings): it starts all the same."""

from __future__ import annotations

from push_service.__main__ import start_warnings
from shared.settings import PushSettings

BASE = {"IMROUTE_API_KEY": "k" * 20, "IMROUTE_SECRET": "s" * 32}


def test_a_complete_configuration_says_nothing() -> None:
    assert start_warnings(PushSettings.load(BASE), BASE) == []


def test_without_a_secret_dispatch_is_said_to_answer_503() -> None:
    env = {"IMROUTE_API_KEY": "k" * 20}
    [said] = start_warnings(PushSettings.load(env), env)
    assert said.startswith("IMROUTE_SECRET is not set: GET /v1/dispatch answers 503")


def test_a_slip_of_a_settings_name_and_a_setting_no_longer_used_are_said() -> None:
    env = {**BASE, "IMROUTE_REDIS_URI": "redis://x", "IMROUTE_JOB_PUBLISH_RETRIES": "3"}
    said = start_warnings(PushSettings.load(env), env)
    assert said == [
        "IMROUTE_REDIS_URI is no setting of imroute, and is ignored: IMROUTE_REDIS_URL?",
        "IMROUTE_JOB_PUBLISH_RETRIES: accepted and no longer used; a job batch's publish "
        "is retried by the bus itself, up to 60 s",
    ]
