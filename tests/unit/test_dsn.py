"""Reading a Postgres URL (`opledger.ledger.dsn`): every spelling libpq and SQLAlchemy take
for a primary and its standby reads as the same hosts, ports and parameters; what it
renders keeps every host for SQLAlchemy's psycopg dialect and for libpq alike; the
password is never shown; a URL that cannot be used is `InvalidInput` saying why, without
repeating it."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from opledger.cli.failures import OPERATIONAL, _safe_url, describe
from opledger.ledger import InvalidInput, dsn
from opledger.ledger.connector import sqlalchemy_url

PASSWORD = "s3cr@t/pw:?#&+"  # every character a URL gives a meaning to
PW = quote(PASSWORD, safe="")
PARAMS = "target_session_attrs=read-write&sslmode=prefer&connect_timeout=3&application_name=ol"

#: one primary and its standby, written every way it can be
SPELLINGS = {
    "libpq netloc": f"postgresql://alice:{PW}@db1.internal:5432,db2.internal:5433/ledger?{PARAMS}",
    "postgres://": f"postgres://alice:{PW}@db1.internal:5432,db2.internal:5433/ledger?{PARAMS}",
    "+psycopg": (
        f"postgresql+psycopg://alice:{PW}@db1.internal:5432,db2.internal:5433/ledger?{PARAMS}"
    ),
    "+psycopg2": (
        f"postgresql+psycopg2://alice:{PW}@db1.internal:5432,db2.internal:5433/ledger?{PARAMS}"
    ),
    "repeated host=h:p": (
        f"postgresql://alice:{PW}@/ledger?host=db1.internal:5432&host=db2.internal:5433&{PARAMS}"
    ),
    "host=h1,h2&port=p1,p2": (
        f"postgresql://alice:{PW}@/ledger?host=db1.internal,db2.internal&port=5432,5433&{PARAMS}"
    ),
    "host=h1:p1,h2:p2": (
        f"postgresql://alice:{PW}@/ledger?host=db1.internal:5432,db2.internal:5433&{PARAMS}"
    ),
    "all in the query, reordered": (
        "postgresql:///?connect_timeout=3&application_name=ol&port=5432,5433&dbname=ledger"
        f"&sslmode=prefer&password={PW}&host=db1.internal,db2.internal&user=alice"
        "&target_session_attrs=read-write"
    ),
    "percent-encoded query": (
        f"postgresql://alice:{PW}@/ledger?host=db1.internal%2Cdb2.internal&port=5432%2C5433"
        "&target_session_attrs=read%2Dwrite&sslmode=prefer&connect_timeout=3"
        "&application_name=%6Fl"
    ),
}

EXPECTED = dsn.PostgresURL(
    hosts=("db1.internal", "db2.internal"),
    ports=(5432, 5433),
    user="alice",
    password=PASSWORD,
    database="ledger",
    params=(
        ("application_name", "ol"),
        ("connect_timeout", "3"),
        ("sslmode", "prefer"),
        ("target_session_attrs", "read-write"),
    ),
)


@pytest.mark.parametrize("url", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_every_spelling_reads_as_the_same_servers_and_parameters(url: str) -> None:
    parsed = dsn.parse(url)
    assert parsed == EXPECTED
    assert parsed.hosts == ("db1.internal", "db2.internal")
    assert parsed.ports == (5432, 5433)
    assert parsed.password == PASSWORD
    assert dict(parsed.params)["target_session_attrs"] == "read-write"


@pytest.mark.parametrize("url", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_libpq_and_sqlalchemy_get_every_host_port_and_parameter(url: str) -> None:
    parsed = dsn.parse(url)
    wanted = {
        "host": "db1.internal,db2.internal",
        "port": "5432,5433",
        "user": "alice",
        "password": PASSWORD,
        "dbname": "ledger",
        "target_session_attrs": "read-write",
        "sslmode": "prefer",
        "connect_timeout": "3",
        "application_name": "ol",
    }
    # libpq's own reading of the conninfo psycopg connects with
    assert conninfo_to_dict(parsed.conninfo()) == wanted
    # what SQLAlchemy's psycopg dialect hands psycopg.connect, from the URL object and
    # from the string (alembic's configuration holds the string)
    for given in (parsed.sqlalchemy(), sqlalchemy_url(url)):
        engine = create_engine(given)
        try:
            args, kwargs = engine.dialect.create_connect_args(engine.url)
        finally:
            engine.dispose()
        assert args == []
        kwargs.pop("context", None)
        assert {k: str(v) for k, v in kwargs.items()} == wanted
        assert engine.url.drivername == "postgresql+psycopg"


@pytest.mark.parametrize(
    "url",
    [
        # libpq's own spellings: what libpq reads from the URL is what `parse` reads
        "postgresql://u:p@h1:1,h2:5432/db?target_session_attrs=read-write",
        "postgresql://u@[::1]:1,[fe80::1%25eth0],h3:5433/db?sslmode=disable",
        "postgresql://u@%2Fvar%2Frun%2Fpostgresql,h2:5/db",
        "postgresql://u@/db?host=h1,h2&port=1,2&application_name=a%20b%2Bc+d",
        "postgresql://u:p@h/db?password=q&user=v&dbname=w",
        "postgresql://u@h1:1,h2:2/db?host=h3,h4",
        "postgresql://u@h/db?ssl=true",
        "postgresql://:5433/db",
        "postgresql:///db",
    ],
)
def test_libpq_reads_each_url_as_parse_does(url: str) -> None:
    assert conninfo_to_dict(dsn.parse(url).conninfo()) == conninfo_to_dict(url)


def test_ipv6_hosts_and_ports_left_out_read_alike() -> None:
    spellings = [
        "postgresql://u@[::1]:1,[fe80::2],h3/db",
        "postgresql://u@/db?host=[::1]:1&host=[fe80::2]&host=h3",
        "postgresql://u@/db?host=::1,fe80::2,h3&port=1,,",
    ]
    read = {dsn.parse(url) for url in spellings}
    assert len(read) == 1
    (parsed,) = read
    assert parsed.hosts == ("::1", "fe80::2", "h3")
    assert parsed.ports == (1, None, None)


def test_one_port_is_every_hosts_and_a_port_per_host_is_its_own() -> None:
    assert dsn.parse("postgresql://u@/db?host=h1,h2&port=5433").ports == (5433, 5433)
    # in the netloc a port belongs to its host, as libpq reads it
    assert dsn.parse("postgresql://u@h1,h2:5433/db").ports == (None, 5433)


@pytest.mark.parametrize(
    "url",
    [
        *SPELLINGS.values(),
        "postgresql://u@[::1]:1,h2/db?sslmode=disable&options=-c%20x%3Dy&application_name=a%2Bb",
        "postgresql://postgres:@/postgres?host=/tmp/socket%20dir",
        "postgresql://u@/db?host=/tmp,h2&port=5432,",
        "postgresql://u@[::1]/d%20b",
        "postgresql://:5433/db",
        "postgresql://h",
    ],
)
def test_each_rendering_reads_back_as_the_same(url: str) -> None:
    parsed = dsn.parse(url)
    assert dsn.parse(parsed.url()) == parsed
    assert dsn.parse(parsed.sqlalchemy()) == parsed
    assert dsn.parse(parsed.sqlalchemy_url()) == parsed
    # SQLAlchemy reads both strings alike (no '+' for a space, which it would take as one)
    assert dsn.parse(make_url(parsed.sqlalchemy_url())) == parsed
    assert dsn.parse(make_url(parsed.url())) == parsed
    assert parsed.with_database("other").database == "other"
    assert dsn.parse(parsed.with_database("other").url()).hosts == parsed.hosts


@pytest.mark.parametrize(
    "url",
    [
        *SPELLINGS.values(),
        f"postgresql://alice:{PW}@db1:5432/ledger",
        f"postgresql://alice:{PW}@db1/ledger?sslpassword={PW}",
        f"postgresql://alice@db1/ledger?password={PW}",
        f"postgresql://alice:{PASSWORD}@db1/ledger",  # raw: '/' ends the authority early
    ],
)
def test_the_password_is_never_shown(url: str) -> None:
    secrets = {PASSWORD, PW, "s3cr", "t/pw", quote(PASSWORD)}
    shown = [dsn.redacted(url), _safe_url(url), repr(dsn.parse(url)) if _parses(url) else ""]
    for text in shown:
        assert not [s for s in secrets if s in text], text
    if _parses(url) and dsn.parse(url).multihost:
        assert dsn.redacted(url).startswith("postgresql://alice:***@/ledger?host=db1.internal,")


def _parses(url: str) -> bool:
    try:
        dsn.parse(url)
    except InvalidInput:
        return False
    return True


def test_the_redacted_url_says_where_it_connects() -> None:
    url = SPELLINGS["libpq netloc"]
    assert dsn.redacted(url) == (
        "postgresql://alice:***@/ledger?host=db1.internal,db2.internal&port=5432,5433"
        "&application_name=ol&connect_timeout=3&sslmode=prefer"
        "&target_session_attrs=read-write"
    )
    assert _safe_url(url) == dsn.redacted(url)
    assert _safe_url("redis://:hunter2@mq.internal:6380/0") == "redis://:***@mq.internal:6380/0"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("", "expected a postgresql:// URL"),
        ("db1.internal:5432", "expected a postgresql:// URL"),
        (f"mysql://u:{PW}@h/db", "the scheme mysql:// is not one opledger connects with"),
        (f"postgresql+asyncpg://u:{PW}@h/db", "postgresql+asyncpg:// is not one"),
        (f"postgresql://u:{PW}@h1:5432,h2:54x2/db", "port 2 is not a number from 1 to 65535"),
        (f"postgresql://u:{PW}@h:70000/db", "the port is not a number from 1 to 65535"),
        ("postgresql://u:pa55/w0rd@h/db", "or in a password is %2F"),
        ("postgresql://u:pa55/w0rd@h", "a '/' in a password is %2F"),
        ("postgresql://u@h1,h2,h3/db?port=1,2", "3 hosts but 2 ports"),
        ("postgresql://u@/db?host=h1:1&host=h2:2&port=1,2", "not both"),
        ("postgresql://u@::1:5432/db", "an IPv6 address goes in brackets"),
        ("postgresql://u@[::1:5432/db", "opens a '[' it does not close"),
        ("postgresql://u@h/db?target_sesion_attrs=read-write", "did you mean target_session_attrs"),
        ("postgresql://u@h/db?password=ab&cd", "query parameter 2 has no '=value'"),
        ("postgresql://u@h/d/b", "a '/' after the database name"),
    ],
)
def test_a_url_that_cannot_be_used_is_invalid_input_saying_why(url: str, says: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        dsn.parse(url)
    message = str(caught.value)
    assert message.startswith("not a usable Postgres URL: ")
    assert says in message, message
    assert caught.value.fields["field"] == dsn.FIELD
    for secret in (PW, PASSWORD, "pa55", "w0rd", "cd"):
        assert secret not in message, message
    # the same through the engine's door (what `Ledger.from_url` and `migrate` call)
    with pytest.raises(InvalidInput):
        sqlalchemy_url(url)
    # the CLI says it in one line, as a setting to fix (exit 4), never as a refusal
    described = describe(caught.value)
    assert described is not None
    code, line = described
    assert code == OPERATIONAL
    assert (
        line
        == f"OPLEDGER_DATABASE_URL is not a usable database URL: {caught.value.fields['reason']}"
    )
    assert "\n" not in line and says in line


def test_a_parameter_given_twice_keeps_the_last_as_libpq_does() -> None:
    url = "postgresql://u@h/db?application_name=a&application_name=b"
    assert dict(dsn.parse(url).params) == {"application_name": "b"}
    assert conninfo_to_dict(url)["application_name"] == "b"
