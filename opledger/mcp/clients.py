"""Who may call the MCP gateway: one bearer token per agent, tied to a tenant and a grant.

The clients file (`OPLEDGER_MCP_CLIENTS`, JSON) keeps each token's sha256, never the
token: `opledger mcp token` makes a token, prints it once and adds its entry. The tenant
and the grant of every call come from here, never from the call's arguments. The file is
read again when it changes, so removing an entry refuses that token at once.

Each entry says how that client's calls name their run (`run`, see `RUN_MODES`): a host
that can set a call's `_meta` names it there (`meta`, the default); a host that cannot
(a desktop host configured by a JSON file) has the gateway derive it (`token`: every call
of the client is in one run of its own) or has the model pass it (`argument`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opledger.ledger import InvalidInput
from opledger.ledger.ids import MAX_IDENTIFIER_LENGTH, check_identifier, check_key

#: what a token starts with (a reader of a log line or a leaked file can tell what it is)
TOKEN_PREFIX = "opl_mcp_"
_HEX64 = re.compile(r"[0-9a-f]{64}")

#: the run is the call's `_meta["opledger/run"]`; a call without one is refused
META = "meta"
#: every call of the client is in the one run of its own (`Caller.own_run`) unless its
#: `_meta` names another: an act is done once per client, for good
TOKEN = "token"
#: each tool declares a required `run` argument the host (or the model) sets
ARGUMENT = "argument"
RUN_MODES = (META, TOKEN, ARGUMENT)
#: the longest agent name: its runs are `mcp:<agent>:<run>`, a run of the ledger at most
#: `MAX_IDENTIFIER_LENGTH` (200) characters, so at least 67 are left for the run's own id
MAX_AGENT_LENGTH = 128


@dataclass(frozen=True)
class Caller:
    """Who a call comes from: an agent, the tenant it acts for, the grant its effects use."""

    agent: str
    tenant: str
    grant: str
    #: how its calls name their run: one of `RUN_MODES`
    run_mode: str = META

    def workflow_id(self, run: str) -> str:
        """The ledger's run of this caller's `run` (another agent's run of the same name is
        another run)."""
        return f"mcp:{self.agent}:{run}"

    @property
    def max_run_length(self) -> int:
        """The longest run (in NFC) this caller may name: what its prefix (`mcp:<agent>:`)
        leaves of the ledger's 200 characters."""
        return MAX_IDENTIFIER_LENGTH - len(self.workflow_id(""))

    @property
    def own_run(self) -> str:
        """The ledger's run of a `token` client's calls that name none: `mcp:<agent>`, which
        no named run (`mcp:<agent>:<run>`) can be. It is the agent's, not the token's, so a
        new token for the same agent keeps its acts."""
        return f"mcp:{self.agent}"

    def owns(self, workflow_id: str) -> bool:
        """Whether `workflow_id` is one of this caller's runs."""
        return workflow_id == self.own_run or workflow_id.startswith(self.workflow_id(""))


def new_token() -> tuple[str, str]:
    """A new bearer token and its sha256 (what the clients file keeps)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, digest(token)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ClientsInvalid(InvalidInput):
    """The clients file cannot be read or is not what the gateway needs."""


def parse(text: str, source: str = "the clients file") -> dict[str, Caller]:
    """token sha256 -> caller, from the file's JSON: `{"clients": [{"agent", "tenant",
    "grant", "token_sha256"}, ...]}`. Raises `ClientsInvalid` naming what is wrong."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ClientsInvalid(f"{source} is not JSON: {exc}") from None
    entries = data.get("clients") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ClientsInvalid(f'{source} needs a "clients" list')
    callers: dict[str, Caller] = {}
    agents: set[str] = set()
    for n, entry in enumerate(entries, 1):
        caller, hashed = _entry(entry, f"{source}, client {n}")
        if caller.agent in agents:
            raise ClientsInvalid(f"{source}: agent {caller.agent!r} is listed twice")
        if hashed in callers:
            raise ClientsInvalid(f"{source}: two clients share one token")
        agents.add(caller.agent)
        callers[hashed] = caller
    return callers


def _entry(entry: Any, where: str) -> tuple[Caller, str]:
    if not isinstance(entry, dict):
        raise ClientsInvalid(f"{where} is not an object")
    missing = [k for k in ("agent", "tenant", "grant", "token_sha256") if k not in entry]
    if missing:
        raise ClientsInvalid(f"{where} lacks {', '.join(missing)}")
    hashed = str(entry["token_sha256"]).lower()
    if not _HEX64.fullmatch(hashed):
        raise ClientsInvalid(f"{where}: token_sha256 must be 64 hex digits (a sha256)")
    if ":" in str(entry["agent"]):  # the agent prefixes its runs: mcp:<agent>:<run>
        raise ClientsInvalid(f"{where}: an agent's name cannot contain ':'")
    mode = entry.get("run", META)
    if mode not in RUN_MODES:
        raise ClientsInvalid(
            f"{where}: run must be one of {', '.join(RUN_MODES)} (how its calls name their "
            f"run), not {str(mode)[:40]!r}"
        )
    try:
        caller = Caller(
            agent=check_key("agent", str(entry["agent"]), max_length=MAX_AGENT_LENGTH),
            tenant=check_key("tenant", str(entry["tenant"])),
            grant=check_identifier("grant", str(entry["grant"])),
            run_mode=mode,
        )
    except InvalidInput as exc:
        raise ClientsInvalid(f"{where}: {exc}") from None
    return caller, hashed


class Clients:
    """The clients file, read again whenever it changes (its size or modification time)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._callers: dict[str, Caller] = {}
        self.current()  # a file that cannot be read stops the gateway at start

    def current(self) -> dict[str, Caller]:
        try:
            stat = self.path.stat()
        except OSError as exc:
            raise ClientsInvalid(f"cannot read the clients file {self.path}: {exc}") from None
        stamp = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if stamp != self._stamp:
                self._callers = parse(self.path.read_text(), f"the clients file {self.path}")
                self._stamp = stamp
            return self._callers

    def caller_for(self, token: str) -> Caller | None:
        """The caller a bearer token stands for, or None. Every entry is compared, in
        constant time, so the answer's timing tells nothing about near misses."""
        hashed = digest(token)
        found: Caller | None = None
        for known, caller in self.current().items():
            if hmac.compare_digest(known, hashed):
                found = caller
        return found


def add_client(path: str | os.PathLike[str], caller: Caller) -> str:
    """Make a token for `caller`, add its entry to the clients file (created if missing)
    and return the token (shown once: only its sha256 is kept)."""
    target = Path(path)
    entries: list[dict[str, Any]] = []
    if target.exists():
        parse(target.read_text(), f"the clients file {target}")
        entries = json.loads(target.read_text())["clients"]
    if any(e.get("agent") == caller.agent for e in entries):
        raise ClientsInvalid(f"agent {caller.agent!r} already has a token in {target}")
    token, hashed = new_token()
    entry = {
        "agent": caller.agent,
        "tenant": caller.tenant,
        "grant": caller.grant,
        "token_sha256": hashed,
    }
    if caller.run_mode != META:  # an entry without one is `meta`, as before modes existed
        entry["run"] = caller.run_mode
    _entry(entry, f"the new client {caller.agent!r}")  # the rules the gateway reads it by
    entries.append(entry)
    tmp = target.with_name(target.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"clients": entries}, out, indent=2)
        out.write("\n")
    os.replace(tmp, target)
    return token
