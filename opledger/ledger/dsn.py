"""A Postgres URL, read once, in every spelling libpq and SQLAlchemy accept for it.

Every process reaches the ledger's database through a URL (`OPLEDGER_DATABASE_URL`):
workers and the CLI through a SQLAlchemy engine, the beat's lock and the agents' LISTEN
connection through psycopg directly. A primary and its standby are named together so
libpq can follow a promotion, and there are several ways to write that:

    postgresql://u:pw@h1:5432,h2:5433/db?target_session_attrs=read-write   (libpq)
    postgresql://u:pw@/db?host=h1,h2&port=5432,5433&target_session_attrs=read-write
    postgresql://u:pw@/db?host=h1:5432&host=h2:5433&target_session_attrs=read-write
                                                      (SQLAlchemy's repeated host)

`parse` reads any of them (with `postgres://`, `postgresql://`, `postgresql+psycopg://`
or `postgresql+psycopg2://`, IPv6 hosts in brackets, a port per host or one for all,
percent-encoded parts, the user, password and database in the query too) into one
`PostgresURL`, which renders each form a caller needs: the SQLAlchemy URL an engine is
made with (psycopg 3, whose dialect passes every host on), the libpq conninfo psycopg
connects with (every host, port and parameter kept), a URL without its password to show,
and a URL to hand on as a setting. Nothing else in opledger takes a Postgres URL apart;
`connector` is the one that connects with what it renders.

Parsed by libpq's rules: a `+` is a plus, not a space (percent-encode a space as `%20`),
a parameter given twice keeps its last value (except `host` and `port`, which list the
hosts), and the query's `host`, `port`, `user`, `password` and `dbname` override what the
URL's authority and path say.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, unquote

from psycopg import pq
from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import URL

from .errors import InvalidInput

#: the `field` of the `InvalidInput` a URL that cannot be used raises
FIELD = "database_url"

#: the schemes read (whatever driver one names, every connection is made with psycopg 3)
_SCHEMES = frozenset({"postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2"})
#: the SQLAlchemy driver every engine of the ledger uses
DRIVER = "postgresql+psycopg"

#: parameters whose value is a secret: never shown
_SECRET_PARAMS = frozenset({"password", "sslpassword"})
#: a query parameter that is a part of the URL proper
_PARTS = {"user": "user", "password": "password", "dbname": "database"}
#: what a redacted URL shows in place of a secret
HIDDEN = "***"

_SCHEME = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")
_PORT = re.compile(r"[0-9]{1,5}")


def _refuse(why: str) -> InvalidInput:
    return InvalidInput(f"not a usable Postgres URL: {why}", field=FIELD, reason=why)


@functools.cache
def _libpq_keywords() -> frozenset[str]:
    """Every connection parameter this libpq knows (`sslmode`, `target_session_attrs`...)."""
    return frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


@dataclasses.dataclass(frozen=True)
class PostgresURL:
    """A Postgres server list and what to connect to it with."""

    #: the hosts in order ("" is libpq's default, the local Unix socket; a host that
    #: starts with "/" is a socket directory)
    hosts: tuple[str, ...] = ()
    #: the port of each host (None: the default, 5432)
    ports: tuple[int | None, ...] = ()
    user: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    database: str | None = None
    #: every other connection parameter, sorted by name (`target_session_attrs`, ...)
    params: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:
        return f"PostgresURL({self.redacted()!r})"

    # -- what callers connect with -------------------------------------------------------

    def sqlalchemy(self) -> URL:
        """The URL `create_engine` takes: the psycopg 3 driver, one host in the URL's
        own place, several (or a socket directory) as `host=h1,h2&port=p1,p2`, which the
        psycopg dialect hands on to libpq as they are."""
        query: dict[str, str] = dict(self.params)
        host: str | None = None
        port: int | None = None
        if len(self.hosts) == 1 and not _is_socket(self.hosts[0]):
            host, port = self.hosts[0] or None, self.ports[0]
        elif self.hosts:
            query["host"] = ",".join(self.hosts)
            if any(p is not None for p in self.ports):
                query["port"] = ",".join("" if p is None else str(p) for p in self.ports)
        return URL.create(
            DRIVER,
            username=self.user,
            password=self.password,
            host=host,
            port=port,
            database=self.database,
            query=query,
        )

    def sqlalchemy_url(self) -> str:
        """`sqlalchemy()` as a string, password included (what alembic's configuration
        holds). Written so SQLAlchemy and `parse` read it alike: nothing is
        percent-encoded as `+`, which SQLAlchemy reads as a space and libpq as a plus."""
        return self._render(DRIVER, self.password)

    def conninfo(self) -> str:
        """The libpq conninfo (`host=h1,h2 port=p1,p2 ...`) `psycopg.connect` takes: every
        host, port and parameter, the password included."""
        values: dict[str, Any] = {}
        if any(self.hosts):
            values["host"] = ",".join(self.hosts)
        if any(p is not None for p in self.ports):
            values["port"] = ",".join("" if p is None else str(p) for p in self.ports)
        for name, value in (
            ("user", self.user),
            ("password", self.password),
            ("dbname", self.database),
        ):
            if value is not None:
                values[name] = value
        values.update(self.params)
        return make_conninfo("", **values)

    def url(self) -> str:
        """A `postgresql://` URL of all of it, password included: what to hand on as
        `OPLEDGER_DATABASE_URL`. One host is written in its usual place, several (or a
        socket directory) as `?host=h1,h2&port=p1,p2`, which libpq, SQLAlchemy and
        `parse` all read the same."""
        return self._render("postgresql", self.password)

    def redacted(self) -> str:
        """The URL to show (`url()`), the password and any other secret parameter as
        `***`."""
        return self._render("postgresql", None if self.password is None else HIDDEN, hide=True)

    def with_database(self, database: str) -> PostgresURL:
        """The same servers and parameters, another database."""
        return dataclasses.replace(self, database=database)

    @property
    def multihost(self) -> bool:
        """Whether it names several hosts (libpq tries them in order)."""
        return len(self.hosts) > 1

    def _render(self, scheme: str, password: str | None, *, hide: bool = False) -> str:
        text = f"{scheme}://"
        if self.user is not None or password is not None:
            if self.user is not None:
                text += quote(self.user, safe="")
            if password is not None:
                text += ":" + (password if hide else quote(password, safe=""))
            text += "@"
        params = list(self.params)
        if len(self.hosts) == 1 and not _is_socket(self.hosts[0]):
            host, port = self.hosts[0], self.ports[0]
            text += f"[{host}]" if ":" in host else quote(host, safe="")
            text += "" if port is None else f":{port}"
        elif self.hosts:
            listed = [("host", ",".join(self.hosts))]
            if any(p is not None for p in self.ports):
                listed.append(("port", ",".join("" if p is None else str(p) for p in self.ports)))
            params = listed + params
        if self.database is not None:
            text += "/" + quote(self.database, safe="")
        if params:
            text += "?" + "&".join(
                f"{quote(name, safe='')}="
                + (HIDDEN if hide and name in _SECRET_PARAMS else quote(value, safe="/,:"))
                for name, value in params
            )
        return text


def _is_socket(host: str) -> bool:
    return host.startswith(("/", "@"))


# -- reading ------------------------------------------------------------------------------


def parse(url: str | URL) -> PostgresURL:
    """`url` (a string in any spelling above, or a SQLAlchemy `URL`) as a `PostgresURL`;
    `InvalidInput` (field `database_url`) saying what is wrong, never repeating the URL
    (it may hold a password)."""
    if isinstance(url, URL):
        return _from_sqlalchemy(url)
    if not isinstance(url, str):
        raise _refuse(f"expected a postgresql:// URL, not {type(url).__name__}")
    text = url.strip()
    scheme = _SCHEME.match(text)
    if scheme is None:
        raise _refuse("expected a postgresql:// URL")
    _check_scheme(scheme["scheme"])
    rest = text[scheme.end() :]
    # the user and password end at the last '@' before the path (or, with no path, the
    # query): a password may hold a raw '@', '?', '#' or ':', never a raw '/'
    slash_at = rest.find("/")
    end = slash_at if slash_at >= 0 else (rest.find("?") if "?" in rest else len(rest))
    at = rest.rfind("@", 0, end)
    user = password = None
    if at >= 0:
        raw_user, colon, raw_password = rest[:at].partition(":")
        user = unquote(raw_user) if raw_user else None
        password = unquote(raw_password) if colon else None
        rest = rest[at + 1 :]
    rest, has_query, query = rest.partition("?")
    hostlist, slash, path = rest.partition("/")
    if "/" in path:
        raise _refuse(
            "a '/' after the database name (a '/' in the database name or in a password is %2F)"
        )
    hosts, ports = _authority_hosts(hostlist) if hostlist else ((), ())
    database = unquote(path) if slash and path else None
    items = [item for item in query.split("&") if item] if has_query else []
    pairs = [_pair(n, item) for n, item in enumerate(items, start=1)]
    return _assemble(hosts, ports, user, password, database, pairs)


def _check_scheme(scheme: str) -> None:
    if scheme.lower() not in _SCHEMES:
        raise _refuse(
            f"the scheme {scheme}:// is not one opledger connects with: use postgresql:// "
            "(postgres://, postgresql+psycopg:// and postgresql+psycopg2:// are read as "
            "the same; every connection is made with psycopg 3)"
        )


def _pair(n: int, item: str) -> tuple[str, str]:
    name, equals, value = item.partition("=")
    if not equals:  # not repeated: it may be the end of a password with a raw '&'
        raise _refuse(f"query parameter {n} has no '=value' (a '&' in a value is %26)")
    return unquote(name), unquote(value)


def _authority_hosts(hostlist: str) -> tuple[list[str], list[str]]:
    """The hosts and ports of `h1:p1,[::1]:p2,h3` (a port may be left out: "")."""
    hosts: list[str] = []
    ports: list[str] = []
    for n, item in enumerate(hostlist.split(","), start=1):
        if item.startswith("["):
            inside, bracket, after = item[1:].partition("]")
            if not bracket or (after and not after.startswith(":")):
                raise _refuse(f"host {n} opens a '[' it does not close before its port")
            host, port = unquote(inside), after[1:]
        else:
            if item.count(":") > 1:
                raise _refuse(
                    f"host {n} has several ':': an IPv6 address goes in brackets, [::1]:5432"
                )
            raw, _, port = item.partition(":")
            host = unquote(raw)
        hosts.append(host)
        ports.append(port)
    return hosts, ports


def _query_hosts(values: Sequence[str]) -> tuple[list[str], list[str], bool]:
    """The hosts of `host=` values (each `h1,h2`, or `h:p` / `[v6]:p`) and the ports they
    carry, and whether any carried one."""
    hosts: list[str] = []
    ports: list[str] = []
    carried = False
    for value in values:
        for item in value.split(","):
            host, port = item, ""
            if item.startswith("["):
                inside, bracket, after = item[1:].partition("]")
                if bracket and (not after or after.startswith(":")):
                    host, port = inside, after[1:]
                    carried = carried or bool(after)
            elif not _is_socket(item) and item.count(":") == 1:
                host, _, port = item.partition(":")
                carried = True
            hosts.append(host)
            ports.append(port)
    return hosts, ports, carried


def _assemble(
    hosts: Sequence[str],
    ports: Sequence[str],
    user: str | None,
    password: str | None,
    database: str | None,
    pairs: Sequence[tuple[str, str]],
) -> PostgresURL:
    servers, numbers = _servers(hosts, ports, pairs)
    parts: dict[str, str | None] = {"user": user, "password": password, "database": database}
    params: dict[str, str] = {}
    for n, (name, value) in enumerate(pairs, start=1):
        if name in ("host", "port"):
            continue
        if name in _PARTS:  # the query's say overrides the URL's, as in libpq
            parts[_PARTS[name]] = value
        elif name == "ssl" and value == "true":  # libpq reads JDBC's spelling too
            params["sslmode"] = "require"
        elif name in _libpq_keywords():
            params[name] = value
        else:
            # the name is not repeated (it may be the end of a password with a raw '&')
            near = difflib.get_close_matches(name, sorted(_libpq_keywords()), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise _refuse(f"query parameter {n} is not a connection parameter libpq knows{hint}")
    return PostgresURL(
        hosts=servers,
        ports=numbers,
        user=parts["user"] or None,
        password=parts["password"],
        database=parts["database"] or None,
        params=tuple(sorted(params.items())),
    )


def _servers(
    hosts: Sequence[str], ports: Sequence[str], pairs: Sequence[tuple[str, str]]
) -> tuple[tuple[str, ...], tuple[int | None, ...]]:
    """The hosts and a port for each, from the URL's authority (`hosts`, `ports`) and the
    query's `host` and `port` parameters, which replace them."""
    host_values = [value for name, value in pairs if name == "host"]
    port_values = [value for name, value in pairs if name == "port"]
    hosts, ports = list(hosts), list(ports)
    if host_values:
        hosts, carried_ports, carried = _query_hosts(host_values)
        if carried:
            if port_values:
                raise _refuse(
                    "give the ports either with each host (host=h1:p1&host=h2:p2) or in "
                    "port=p1,p2, not both"
                )
            ports = carried_ports
    if port_values:
        ports = [p for value in port_values for p in value.split(",")]
    numbers = _ports(ports)
    if not hosts and numbers:
        hosts = [""]
    if len(numbers) == 1 and len(hosts) > 1:
        numbers = numbers * len(hosts)  # one port for every host, as libpq reads it
    elif numbers and len(numbers) != len(hosts):
        raise _refuse(
            f"{len(hosts)} hosts but {len(numbers)} ports: give one port for all, or one per host"
        )
    if not numbers:
        numbers = [None] * len(hosts)
    return tuple(hosts), tuple(numbers)


def _ports(ports: Sequence[str]) -> list[int | None]:
    if not any(ports):
        return []
    numbers: list[int | None] = []
    for n, port in enumerate(ports, start=1):
        if not port:
            numbers.append(None)
            continue
        if not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
            where = f"port {n}" if len(ports) > 1 else "the port"
            raise _refuse(f"{where} is not a number from 1 to 65535 (a '/' in a password is %2F)")
        numbers.append(int(port))
    return numbers


def _from_sqlalchemy(url: URL) -> PostgresURL:
    """A SQLAlchemy `URL` (an engine's): its fields as they are, its query as given."""
    _check_scheme(url.drivername)
    pairs: list[tuple[str, str]] = []
    for name, value in url.query.items():
        values = [value] if isinstance(value, str) else list(value)
        pairs.extend((name, v) for v in values)
    hosts: list[str] = []
    ports: list[str] = []
    if url.host is not None or url.port is not None:
        hosts, ports = [url.host or ""], ["" if url.port is None else str(url.port)]
    password = None if url.password is None else str(url.password)
    return _assemble(hosts, ports, url.username, password, url.database, pairs)


def redacted(url: str | URL) -> str:
    """`url` without its password, to show; "an unparsable URL" when it is not one (it is
    then not repeated: it may hold a secret)."""
    try:
        return parse(url).redacted()
    except InvalidInput:
        return "an unparsable URL"


def is_postgres(url: str) -> bool:
    """Whether `url` names a scheme `parse` reads (whether or not the rest is valid)."""
    scheme = _SCHEME.match(url.strip())
    return scheme is not None and scheme["scheme"].lower() in _SCHEMES


__all__ = [
    "DRIVER",
    "FIELD",
    "HIDDEN",
    "PostgresURL",
    "is_postgres",
    "parse",
    "redacted",
]
