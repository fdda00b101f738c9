"""The IMROUTE_WEBHOOK_* settings: off by default, a secret required with the URL."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError
from shared.settings import Settings

URL = "https://app.example/hooks"
SECRET = "whsec-0123456789ab"


def test_webhooks_are_off_by_default() -> None:
    s = Settings.load({})
    assert s.webhook_url is None and s.webhook_secret is None
    assert (s.webhook_offline_grace_s, s.webhook_queue_max, s.webhook_batch_max) == (
        5,
        100_000,
        100,
    )


def test_a_url_with_its_secret_loads_and_the_secret_stays_hidden() -> None:
    s = Settings.load({"IMROUTE_WEBHOOK_URL": URL, "IMROUTE_WEBHOOK_SECRET": SECRET})
    assert s.webhook_url == URL
    assert s.webhook_secret is not None and s.webhook_secret.get_secret_value() == SECRET
    assert SECRET not in repr(s) and SECRET not in str(s.model_dump())


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"IMROUTE_WEBHOOK_URL": URL}, "IMROUTE_WEBHOOK_SECRET is required"),
        ({"IMROUTE_WEBHOOK_URL": URL, "IMROUTE_WEBHOOK_SECRET": "short"}, "IMROUTE_WEBHOOK_SECRET"),
        ({"IMROUTE_WEBHOOK_URL": "ftp://app/x", "IMROUTE_WEBHOOK_SECRET": SECRET}, "http://"),
        ({"IMROUTE_WEBHOOK_URL": "http:///nohost", "IMROUTE_WEBHOOK_SECRET": SECRET}, "host"),
        ({"IMROUTE_WEBHOOK_OFFLINE_GRACE_S": "-1"}, "IMROUTE_WEBHOOK_OFFLINE_GRACE_S"),
        ({"IMROUTE_WEBHOOK_QUEUE_MAX": "1"}, "IMROUTE_WEBHOOK_QUEUE_MAX"),
        ({"IMROUTE_WEBHOOK_BATCH_MAX": "0"}, "IMROUTE_WEBHOOK_BATCH_MAX"),
    ],
)
def test_bad_webhook_settings_are_named(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named) as caught:
        Settings.load(env)
    secrets = {v for k, v in env.items() if k == "IMROUTE_WEBHOOK_SECRET"}
    assert not any(secret in str(caught.value) for secret in secrets)  # never echoed
