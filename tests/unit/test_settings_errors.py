"""A refused setting is named in one line that never quotes a secret."""

from __future__ import annotations

import pytest

from opledger.settings import Settings, SettingsInvalid


@pytest.mark.parametrize(
    ("env", "secret", "says"),
    [
        ({"OPLEDGER_DATABASE_URL": "mysql://bob:hunter2@db/x"}, "hunter2", "mysql://bob:***@db"),
        ({"OPLEDGER_STRIPE_API_KEY": "sk_test_x y"}, "sk_test_x y", "no key has"),
        (
            {
                "OPLEDGER_SMTP_SENT_IMAP_HOST": "imap.example.com",
                "OPLEDGER_SMTP_SENT_IMAP_USER": "ann",
                "OPLEDGER_SMTP_SENT_IMAP_PASSWORD": "pässwort\n",
            },
            "pässwort",
            "OPLEDGER_SMTP_SENT_IMAP_PASSWORD cannot be sent to IMAP",
        ),
    ],
)
def test_a_refused_value_is_said_without_its_secret(
    env: dict[str, str], secret: str, says: str
) -> None:
    with pytest.raises(SettingsInvalid) as refused:
        Settings.from_environ(env)
    text = str(refused.value)
    assert says in text and secret not in text and "\n" not in text


def test_a_plain_value_is_still_quoted() -> None:
    with pytest.raises(SettingsInvalid, match=r"OPLEDGER_LEASE_SECONDS: .*\(got '-1'\)"):
        Settings.from_environ({"OPLEDGER_LEASE_SECONDS": "-1"})
