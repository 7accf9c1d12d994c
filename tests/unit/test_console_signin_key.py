"""OPLEDGER_CONSOLE_SIGNIN_KEY: refused in one line that never quotes it when too weak."""

from __future__ import annotations

import pytest

from opledger.settings import Settings, SettingsInvalid


def test_a_weak_signin_key_is_one_line_without_the_key() -> None:
    with pytest.raises(SettingsInvalid) as caught:
        Settings.from_environ({"OPLEDGER_CONSOLE_SIGNIN_KEY": "short-Secret-1"})
    said = str(caught.value)
    assert "OPLEDGER_CONSOLE_SIGNIN_KEY" in said and "\n" not in said, said
    assert "short-Secret-1" not in said


def test_a_strong_signin_key_is_kept_hidden() -> None:
    key = "a-long-enough-console-signin-key-0123456789"
    settings = Settings.from_environ({"OPLEDGER_CONSOLE_SIGNIN_KEY": key})
    assert settings.console_signin_key is not None
    assert settings.console_signin_key.get_secret_value() == key
    assert key not in repr(settings)
