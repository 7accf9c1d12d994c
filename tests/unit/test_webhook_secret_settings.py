"""The review webhook's signing secrets as settings: refused in one line that names the
variable and never quotes the value, wired into the adapter the default registry builds,
and never shown by `opledger check`, which warns when a webhook would go unsigned."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from pydantic import SecretStr

from opledger.adapters.defaults import build_registry
from opledger.adapters.webhook import WebhookAdapter
from opledger.cli.checks import run_checks
from opledger.dev.processes import unconfigured_environ
from opledger.settings import Settings, SettingsInvalid
from opledger.signatures import HEADER, MIN_SECRET_CHARS, secret_problem, signature_header

URL = "http://127.0.0.1:9/hooks/reviews"  # nothing is sent in these tests
CURRENT = "Kq3" + "x" * 29 + "-current"
PREVIOUS = "Zr7" + "y" * 29 + "-previous"
WEBHOOK = {"OPLEDGER_REVIEW_WEBHOOK_URL": URL}


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"OPLEDGER_REVIEW_WEBHOOK_SECRET": "hunter2-too-short"},
            "OPLEDGER_REVIEW_WEBHOOK_SECRET: not a usable signing secret: too short: 17 "
            "characters, at least 32",
        ),
        (
            {"OPLEDGER_REVIEW_WEBHOOK_SECRET": CURRENT + "\n"},
            "OPLEDGER_REVIEW_WEBHOOK_SECRET: not a usable signing secret: it holds whitespace",
        ),
        ({"OPLEDGER_REVIEW_WEBHOOK_SECRET": CURRENT.replace("x", "é")}, "non-ASCII"),
        (
            {
                "OPLEDGER_REVIEW_WEBHOOK_SECRET": CURRENT,
                "OPLEDGER_REVIEW_WEBHOOK_PREVIOUS_SECRET": "hunter2-old",
            },
            "OPLEDGER_REVIEW_WEBHOOK_PREVIOUS_SECRET: not a usable signing secret: too short",
        ),
        (
            {"OPLEDGER_REVIEW_WEBHOOK_PREVIOUS_SECRET": PREVIOUS},
            "OPLEDGER_REVIEW_WEBHOOK_PREVIOUS_SECRET: set only beside "
            "OPLEDGER_REVIEW_WEBHOOK_SECRET",
        ),
    ],
)
def test_a_refused_secret_is_named_in_one_line_without_its_value(
    env: dict[str, str], says: str
) -> None:
    with pytest.raises(SettingsInvalid) as refused:
        Settings.from_environ({**WEBHOOK, **env})
    text = str(refused.value)
    assert says in text and "\n" not in text, text
    for secret in env.values():
        assert secret.strip() not in text, text


def test_the_minimum_length_is_32_characters() -> None:
    assert MIN_SECRET_CHARS == 32
    assert secret_problem("a" * 31) is not None
    assert secret_problem("a" * 32) is None
    Settings.from_environ({"OPLEDGER_REVIEW_WEBHOOK_SECRET": "a" * 32})
    with pytest.raises(SettingsInvalid, match="31 characters, at least 32"):
        Settings.from_environ({"OPLEDGER_REVIEW_WEBHOOK_SECRET": "a" * 31})


def test_an_empty_secret_is_unset() -> None:
    settings = Settings.from_environ({"OPLEDGER_REVIEW_WEBHOOK_SECRET": ""})
    assert settings.review_webhook_secret is None


def test_accepted_secrets_are_never_shown_by_the_settings() -> None:
    settings = Settings.from_environ(
        {
            **WEBHOOK,
            "OPLEDGER_REVIEW_WEBHOOK_SECRET": CURRENT,
            "OPLEDGER_REVIEW_WEBHOOK_PREVIOUS_SECRET": PREVIOUS,
        }
    )
    assert isinstance(settings.review_webhook_secret, SecretStr)
    assert settings.review_webhook_secret.get_secret_value() == CURRENT
    shown = repr(settings) + str(settings) + settings.model_dump_json()
    assert CURRENT not in shown and PREVIOUS not in shown


def test_the_adapter_refuses_a_weak_secret_without_quoting_it() -> None:
    with pytest.raises(ValueError, match="too short") as refused:
        WebhookAdapter(URL, secrets=[SecretStr("hunter2-weak")])
    assert "hunter2" not in str(refused.value)


def test_the_default_registry_signs_with_the_current_then_the_previous_secret() -> None:
    def header(env: dict[str, str]) -> str | None:
        registry = build_registry(Settings.from_environ({**WEBHOOK, **env}))
        try:
            adapter = registry.adapter_for("webhook.post.v1")
            assert isinstance(adapter, WebhookAdapter)
            return adapter.headers(b"{}", "op_1").get(HEADER)
        finally:
            registry.close()

    assert header({}) is None
    one = header({"OPLEDGER_REVIEW_WEBHOOK_SECRET": CURRENT})
    two = header(
        {
            "OPLEDGER_REVIEW_WEBHOOK_SECRET": CURRENT,
            "OPLEDGER_REVIEW_WEBHOOK_PREVIOUS_SECRET": PREVIOUS,
        }
    )
    assert one is not None and two is not None
    # Each header is checked at its own timestamp (the two may fall in different seconds).
    for got, secrets in ((one, [CURRENT]), (two, [CURRENT, PREVIOUS])):
        stamp = re.fullmatch(r"t=(\d+)(?:,v1=[0-9a-f]{64})+", got)
        assert stamp is not None, got
        assert got == signature_header(b"{}", secrets, int(stamp.group(1)))
    assert two.count(",v1=") == 2 and one.count(",v1=") == 1


# -- opledger check ------------------------------------------------------------------------


def _review_webhook_lines(env: dict[str, str]) -> list[str]:
    checks = run_checks(env, broker=False, database=False)
    return [c.line() for c in checks if c.name == "review webhook"]


def test_check_warns_when_a_configured_webhook_is_unsigned() -> None:
    assert _review_webhook_lines({}) == []  # no webhook, nothing to sign
    [line] = _review_webhook_lines(WEBHOOK)
    assert line.startswith("warn review webhook: review webhooks are sent unsigned"), line
    [line] = _review_webhook_lines({**WEBHOOK, "OPLEDGER_REVIEW_WEBHOOK_SECRET": CURRENT})
    assert line == "ok   review webhook: signed with OPLEDGER_REVIEW_WEBHOOK_SECRET"


def test_check_never_shows_a_secret() -> None:
    """The real command, as an operator runs it: its text and JSON output, a refused
    secret's line too."""
    signed = {
        **WEBHOOK,
        "OPLEDGER_REVIEW_WEBHOOK_SECRET": CURRENT,
        "OPLEDGER_REVIEW_WEBHOOK_PREVIOUS_SECRET": PREVIOUS,
    }
    weak = {**WEBHOOK, "OPLEDGER_REVIEW_WEBHOOK_SECRET": "hunter2-weak"}
    outputs = {}
    for name, env, args in (
        ("unsigned", WEBHOOK, []),
        ("signed", signed, []),
        ("signed json", signed, ["--json"]),
        ("weak", weak, []),
    ):
        ran = subprocess.run(
            [sys.executable, "-m", "opledger.cli", "check", "--no-broker", *args],
            env={**unconfigured_environ(), **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        outputs[name] = ran.stdout + ran.stderr
        for secret in (CURRENT, PREVIOUS, "hunter2"):
            assert secret not in outputs[name], (name, outputs[name])
    assert "warn review webhook: review webhooks are sent unsigned" in outputs["unsigned"]
    assert (
        "ok   review webhook: signed with OPLEDGER_REVIEW_WEBHOOK_SECRET and "
        "OPLEDGER_REVIEW_WEBHOOK_PREVIOUS_SECRET (rotating)" in outputs["signed"]
    )
    parsed = json.loads(outputs["signed json"][: outputs["signed json"].rindex("]") + 1])
    assert any(c["name"] == "review webhook" and c["ok"] for c in parsed)
    assert (
        "FAIL settings: OPLEDGER_REVIEW_WEBHOOK_SECRET: not a usable signing secret: too "
        "short" in outputs["weak"]
    )
