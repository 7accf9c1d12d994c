"""A sign-in name Postgres cannot store as typed (a NUL byte, which a form can carry as
`%00`) is checked, counted and throttled like any other unknown name: a wrong-password
answer, never a server error, and no way around the name's throttle."""

from __future__ import annotations

from datetime import timedelta

from argon2 import PasswordHasher

from opledger.console.accounts import Accounts, signin_name
from opledger.ledger import Ledger


def test_a_name_with_a_nul_byte_is_an_unknown_name_on_record(ledger: Ledger) -> None:
    accounts = Accounts(
        ledger.engine, hasher=PasswordHasher(time_cost=1, memory_cost=64, parallelism=1)
    )
    accounts.add("alice", tenants=["acme"], password="a long enough password", by="test")
    typed = "alice\x00"
    # the throttle reads the failures on record before any check: it must not fail
    before = accounts.signin_failures(typed, "127.0.0.1", window=timedelta(minutes=15))
    assert before.operator == 0
    assert accounts.authenticate(typed, "a long enough password") is None
    for _ in range(3):
        accounts.record_signin(typed, "127.0.0.1", ok=False)
    after = accounts.signin_failures(typed, "127.0.0.1", window=timedelta(minutes=15))
    assert after.operator == 3 and after.address == 3
    # recorded under a name of its own, not alice's: her count is untouched
    assert accounts.signin_failures("alice", "10.0.0.9", window=timedelta(minutes=15)).operator == 0
    assert signin_name(typed) != "alice" and "\x00" not in signin_name(typed)
    assert [a.operator for a in accounts.signins(typed)] == [signin_name(typed)] * 3
