"""An `OPLEDGER_` variable that is no setting is named with the setting it likely means:
the words people use for a setting's words, a close spelling, or the one setting that
holds all of its words; never a setting that merely shares the prefix and a word."""

from __future__ import annotations

import pytest

from opledger.settings import suggestion, unknown_variables


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("OPLEDGER_DB_URL", "OPLEDGER_DATABASE_URL"),  # was OPLEDGER_CRM_URL
        ("OPLEDGER_DATABASE_ULR", "OPLEDGER_DATABASE_URL"),
        ("OPLEDGER_DATABASE_URI", "OPLEDGER_DATABASE_URL"),
        ("OPLEDGER_POSTGRES_URL", "OPLEDGER_DATABASE_URL"),
        ("OPLEDGER_DSN", "OPLEDGER_DATABASE_URL"),
        ("OPLEDGER_DB_SCHEMA", "OPLEDGER_DATABASE_SCHEMA"),
        ("OPLEDGER_SCHEMA", "OPLEDGER_DATABASE_SCHEMA"),
        ("OPLEDGER_REDIS_URL", "OPLEDGER_BROKER_URL"),
        ("OPLEDGER_CELERY_BROKER_URL", "OPLEDGER_BROKER_URL"),
        ("OPLEDGER_BROKER", "OPLEDGER_BROKER_URL"),
        ("OPLEDGER_LEASE_SECS", "OPLEDGER_LEASE_SECONDS"),
        ("OPLEDGER_CRM_ULR", "OPLEDGER_CRM_URL"),
        ("OPLEDGER_FLOWER_PASS", "OPLEDGER_FLOWER_PASSWORD"),
        ("OPLEDGER_URL", None),  # many settings end in URL: none is named
        ("OPLEDGER_FROBNICATE", None),
    ],
)
def test_the_setting_a_variable_likely_means(variable: str, meant: str | None) -> None:
    assert suggestion(variable) == meant


def test_unknown_variables_name_their_setting_and_skip_settings_and_tooling() -> None:
    environ = {
        "OPLEDGER_DB_URL": "postgresql://x/y",
        "OPLEDGER_DATABASE_URL": "postgresql://x/y",
        "OPLEDGER_STATE_DIR": "/tmp",
        "OPLEDGER_FROBNICATE": "1",
        "PATH": "/bin",
    }
    assert unknown_variables(environ) == [
        "OPLEDGER_DB_URL (did you mean OPLEDGER_DATABASE_URL?)",
        "OPLEDGER_FROBNICATE",
    ]


def test_a_missing_setting_names_the_variable_set_in_its_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opledger.settings import NotConfigured, Settings

    monkeypatch.delenv("OPLEDGER_DATABASE_URL", raising=False)
    monkeypatch.delenv("OPLEDGER_DEV", raising=False)
    monkeypatch.setenv("OPLEDGER_DB_URL", "postgresql://x/y")
    with pytest.raises(NotConfigured, match=r"; OPLEDGER_DB_URL is set, a typo\?$"):
        Settings.from_environ({}).require_database_url()
