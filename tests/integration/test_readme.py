"""README.md and the docs as a test: every fenced block of every page runs as written, or
says why it does not.

The pages are README.md and every page of the docs site (docs/**/*.md). Each block is
known to `BLOCKS` by a short hash of its text, whatever page it is on (a block moved from
one page to another keeps its verdict), so editing a block makes this test fail until
someone has looked at how the new text is verified (the failure prints the page, the line
and the new key). A block's verdict is one of:

- `Python`: run in page order in one namespace per page, like a notebook session (a later
  block uses what an earlier one defined on the same page, as its reader would), the
  pages one after the other in one process of its own whose environment names the
  suite's services: the session's migrated test database (its tables emptied first), a
  Redis database of its own for the broker, the sandbox providers. `then` holds this
  test's own checks of what the block did; they see the namespace, never change it.
- `Shell`: the commands are run as written by `bash -euo pipefail` (and -x, to show which
  one failed) in a temporary directory, with the same environment and the virtualenv's
  bin first on PATH; processes a block starts with `&` are stopped at the end. Per
  command, the block's verdict may say instead that it is a long-running process (started
  with its exact command line, it must get ready, or stay up for a few seconds, or exit 0;
  then it is stopped), or that another named test covers it (that test must exist, and
  the command line must still parse): the system tests of `demo`, `chaos` and `bench`,
  and tests/unit/test_compose.py for `docker compose up` (no Docker engine here, and it
  would start services of its own). Placeholders such as `op_01J...` are replaced by
  values from the fixtures, declared in `substitute` so the substitution is visible.
- `NotCode`: sample output, the directory layout, a file's format.
- `Covered`: a whole block another named test runs as written, or checks word for word
  against a file it runs, where this one cannot (the pip quick start, in a fresh
  virtualenv with the package installed from a clone; the adapter guide's excerpts of
  examples/adapter_tickets.py).

Nothing here starts a service of its own: no `OPLEDGER_DEV`, every URL is the fixtures'.
The blocks run side by side (each CLI start costs a second or two of CPU), and a command
that an earlier block runs exactly so (`opledger migrate`) runs once; so does a
long-running one that a block starts in the background and uses (`opledger sandbox
--port ...`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import typer
from sqlalchemy import text

from opledger.cli.main import app as cli_app
from opledger.dev.processes import unconfigured_environ
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ambiguous, Ledger

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
BIN = Path(sys.executable).parent  # the virtualenv's bin: `opledger`, `python`
SCRIPT_TIMEOUT = 90.0  # seconds one block's commands may take
LONG_RUNNING_GRACE = 20.0  # seconds a long-running process has to get ready
#: jobs (a block's commands, a long-running process) run side by side: each CLI start costs
#: a second or two of CPU, and more at once only slow each other down on two cores
LANES = 4
#: what a long-running process prints once it is up, by `opledger` subcommand
READY = {
    # Celery's banner: the command line parsed, the startup checks (settings, database,
    # schema, broker) passed and Celery took its options
    "worker": re.compile(r"-- celery@\S+ v\d"),
    "beat": re.compile(r"beat: Starting"),
    "flower": re.compile(r"Visit me at"),
    "sandbox": re.compile(r'^\{"http": '),
}


# -- the pages' blocks -------------------------------------------------------------------


def pages() -> list[Path]:
    """README.md, then every page of the docs site in path order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def page_name(path: Path) -> str:
    return str(path.relative_to(REPO))


@dataclass(frozen=True)
class Command:
    """One shell command of a block: its lines as written, continuations included."""

    raw: str

    @property
    def words(self) -> list[str]:
        return shlex.split(self.raw.replace("\\\n", " "), comments=True)

    @property
    def text(self) -> str:
        """The command without its comment, words joined by one space (the table's key)."""
        return " ".join(self.words)

    @property
    def program(self) -> list[str]:
        """The words after any leading VAR=value assignments."""
        words = self.words
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words = words[1:]
        return words


@dataclass(frozen=True)
class Block:
    line: int  # the line of the opening fence
    lang: str
    text: str  # as the reader copies it: the fence's own indentation removed
    page: str = "README.md"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.lang}\n{self.text}".encode()).hexdigest()[:10]

    @property
    def first(self) -> str:
        return self.text.splitlines()[0] if self.text else ""

    def commands(self) -> list[Command]:
        """The shell commands, a `\\`-continued line joined to the next; comment-only and
        blank lines are no commands."""
        commands: list[Command] = []
        pending: list[str] = []
        for line in self.text.splitlines():
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            pending.append(line)
            if not line.rstrip().endswith("\\"):
                commands.append(Command("\n".join(pending)))
                pending = []
        assert not pending, f"{self.where}: a continuation line ends the block"
        return commands


FENCE = re.compile(r"^( *)```(\S*)\s*$")


def page_blocks(path: Path = README, text: str | None = None) -> list[Block]:
    """Every fenced block of one page (```python, ```sh, unlabelled, indented in a list
    too), in order."""
    lines = (path.read_text() if text is None else text).splitlines()
    page = page_name(path)
    blocks: list[Block] = []
    opened: tuple[int, str, int] | None = None  # line, language, indentation
    body: list[str] = []
    for n, line in enumerate(lines, start=1):
        fence = FENCE.match(line)
        if opened is None:
            if fence:
                opened, body = (n, fence.group(2), len(fence.group(1))), []
        elif line.strip() == "```":
            blocks.append(Block(opened[0], opened[1], "\n".join(body), page))
            opened = None
        else:
            indent = opened[2]
            assert not line[:indent].strip(), f"{page}:{n}: a line left of its fence"
            body.append(line[indent:])
    assert opened is None, f"{page}:{opened[0]}: a fence is never closed"
    return blocks


def all_blocks() -> list[Block]:
    """Every page's blocks, page after page."""
    return [block for path in pages() for block in page_blocks(path)]


# -- how each block is verified -----------------------------------------------------------


@dataclass(frozen=True)
class NotCode:
    first: str  # how the block's first line starts: for the reader of this table
    why: str


@dataclass(frozen=True)
class Python:
    first: str
    then: str = ""  # this test's checks, run after the block in a copy of its namespace


@dataclass(frozen=True)
class Shell:
    first: str
    #: commands (as `Command.text`) started as long-running processes, then stopped
    long_running: tuple[str, ...] = ()
    #: commands (as `Command.text`) another test covers: "tests/...py::test_name", ...
    covered: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: (as written, replacement): `{name}` in the replacement is a fixture's value
    substitute: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Covered:
    """A whole block another test runs as written, in a setting this one cannot give it
    (a fresh virtualenv the package is installed into, say)."""

    first: str
    test: str  # "tests/...py::test_name"


Verdict = NotCode | Python | Shell | Covered

PIP_QUICKSTART_TEST = (
    "tests/system/test_pip_quickstart.py::test_the_pip_quick_start_runs_as_written"
)

SWITCHES_TEST = (
    "tests/integration/test_switches.py::"
    "test_the_switches_command_lists_epochs_orphans_and_ends_a_window"
)
CHECK_TEST = (
    "tests/integration/test_startup_checks.py::"
    "test_check_reports_every_part_and_passes_on_a_good_setup"
)
DEMO_TEST = "tests/system/test_demo.py::test_the_demo_runs_from_a_clean_clone_with_zero_duplicates"
CHAOS_TEST = "tests/system/test_chaos.py::test_ci_sized_chaos_run_keeps_every_invariant"
BENCH_TEST = "tests/system/test_bench_smoke.py::test_a_tiny_bench_run"
AGENTS_BENCH_TEST = "tests/system/test_bench_smoke.py::test_a_tiny_agents_bench_run"

LANGGRAPH_TEST = (
    "tests/system/test_langgraph_onboarding.py::"
    "test_a_run_then_time_travel_replay_and_forks_cause_each_act_once"
)
LANGGRAPH_KILL_TEST = (
    "tests/system/test_langgraph_onboarding.py::"
    "test_a_kill_mid_tool_then_resume_or_rerun_causes_each_act_once"
)
EXAMPLE = "python -m opledger.examples.langgraph_onboarding"
WHEEL_LANGGRAPH_TEST = (
    "tests/system/test_wheel.py::test_the_langgraph_example_runs_from_the_wheel_as_the_docs_say"
)
PAI_RUN = (
    "tests/system/test_pydantic_ai.py::test_a_run_then_the_model_asked_again_causes_each_act_once"
)
PAI_KILL = "tests/system/test_pydantic_ai.py::test_a_kill_mid_tool_then_resume_causes_each_act_once"
OAI = "python -m opledger.examples.openai_agents_support"
OAI_RUN = (
    "tests/system/test_openai_agents.py::"
    "test_a_run_then_a_retry_with_new_ids_and_wording_cause_each_act_once"
)
OAI_KILL = (
    "tests/system/test_openai_agents.py::"
    "test_a_kill_mid_tool_then_resume_with_the_session_causes_each_act_once"
)
OAI_APPROVAL = (
    "tests/system/test_openai_agents.py::"
    "test_an_approved_call_killed_mid_tool_and_approved_again_is_one_close"
)
TRACES_TEST = (
    "tests/system/test_traces.py::"
    "test_one_operations_trace_is_whole_and_a_crash_is_reconciled_with_a_lookup"
)

MAKE_TEST = "test_make_test_runs_lint_types_contracts_and_the_suite"
CONSOLE_ACCESS = "tests/integration/test_console_access.py"
OPS = "test_operator_add_refuses_bad_input_and_keeps_only_a_hash"
SESSIONS = "test_password_sign_in_csrf_sessions_that_expire_and_disabling"
CONSOLE_BROWSER = (
    "tests/system/test_console_browser.py::"
    "test_sign_in_open_the_queue_and_a_crash_review_resolve_it_and_see_the_audit_row"
)
ADAPTER_GUIDE = "tests/integration/test_adapter_guide.py"
#: the guide's Python blocks are examples/adapter_tickets.py, whole and in excerpts word for
#: word, which the guide's tests run against a Tickets server of their own
ADAPTER_EXCERPT = f"{ADAPTER_GUIDE}::test_the_guide_shows_the_example_file_as_it_is"
MCP_GATEWAY_TESTS = (
    "tests/system/test_mcp_gateway.py::test_a_call_whose_answer_was_lost_is_reissued_and_the_case_is_updated_once",
    "tests/system/test_mcp_gateway.py::test_the_example_agent_closes_and_emails_once_however_often_it_runs",
)
MCP_PROXY_TESTS = (
    "tests/system/test_mcp_proxy.py::test_a_lost_answer_of_the_upstream_is_unknown_and_goes_to_a_person_after_one_call",
    "tests/system/test_mcp_proxy.py::test_a_confirmed_call_asked_again_is_answered_and_not_repeated",
)
OUTBOX_TABLE = "case_closures"  # the outbox example creates it in the ledger's database
#: checks after a block that published `op`: its message is queued, the operation prepared
PUBLISHED = """
import os, redis
from opledger.ledger import Status
queued = redis.Redis.from_url(os.environ["OPLEDGER_BROKER_URL"]).lrange("dispatch", 0, -1)
assert any(op.id.encode() in message for message in queued), queued
assert ledger.get(op.id).status is Status.PREPARED
"""

BLOCKS: dict[str, Verdict] = {
    "74bacb3078": Shell(
        "make demo    # creates .venv",
        covered={
            "make demo": (DEMO_TEST,),
            "make test": (f"tests/integration/{Path(__file__).name}::{MAKE_TEST}",),
        },
    ),
    "d07fc9230e": NotCode(
        "16 operations: 0 duplicate effects,",
        "what `make demo` prints last",
    ),
    "7b2fd8a3f6": Python(
        "import os",
        then="""
from opledger.ledger import Status
assert ledger.get(op.id).status is Status.CONFIRMED, ledger.history(op.id)
""",
    ),
    "373532f36c": Shell(
        "opledger sandbox --port 8025 &",
        substitute=(("8025", "{port}"),),
    ),
    "0f0c6357fe": Python(
        "from opledger.tasks.app import publish_dispatch, runtime",
        then=PUBLISHED,
    ),
    "fbb4bbe03e": Python(
        "from sqlalchemy import text",
        then=PUBLISHED
        + f"""
with ledger.engine.connect() as conn:
    rows = conn.execute(text("SELECT case_id FROM {OUTBOX_TABLE}")).scalars().all()
assert "case-319" in rows, rows
""",
    ),
    "3d012deb05": Shell(
        "opledger migrate",
        # its output is only thrown away here: the startup checks' test runs it as a process
        # and reads each line it promises
        covered={"opledger check": (CHECK_TEST,)},
        long_running=(
            "opledger worker -c 4",
            "opledger beat",
            "OPLEDGER_FLOWER_PASSWORD=... opledger flower --port 5555",
        ),
        substitute=(
            ("op_01J...", "{op}"),
            ("OPLEDGER_FLOWER_PASSWORD=...", "OPLEDGER_FLOWER_PASSWORD={flower_password}"),
            ("--port 5555", "--port {flower_port}"),
        ),
    ),
    "42d813b964": Shell(
        "OPLEDGER_FLOWER_PASSWORD=change-me docker compose up -d --scale worker=3",
        # no Docker engine here, and it would start services of its own: the compose
        # file's services, settings, scaling and Flower's password are checked instead
        covered={
            "OPLEDGER_FLOWER_PASSWORD=change-me docker compose up -d --scale worker=3": (
                "tests/unit/test_compose.py::test_every_service_is_there_with_a_healthcheck_where_it_matters",
                "tests/unit/test_compose.py::test_opledger_services_run_real_commands_with_real_settings",
                "tests/unit/test_compose.py::test_flower_is_never_open_without_a_password",
            )
        },
    ),
    "9010c76564": Shell(
        'python -c "import os,base64; print(base64.b64encode(os.urandom(32)).decode())"',
        # rotated here, it would encrypt the payloads other blocks' workers are reading,
        # under keys they do not hold: the rotation's own test runs it as a process
        covered={
            "opledger payloads rotate --batch 500": (
                "tests/integration/test_payload_keys.py::test_rotation_moves_every_row_to_the_new_key_and_the_old_key_can_go",
                "tests/integration/test_payload_keys.py::test_result_data_is_sealed_like_the_payload_read_back_and_rotated",
            )
        },
    ),
    "174658330b": Shell(
        "opledger mcp token --agent onboarding --tenant acme",
        # the gateway serves until stopped: its system tests start it as written (a clients
        # file, `mcp serve --port`) and call it over streamable HTTP
        covered={
            "OPLEDGER_MCP_CLIENTS=mcp-clients.json opledger mcp serve --port 8765": (
                "tests/system/test_mcp_gateway.py::test_a_call_whose_answer_was_lost_is_reissued_and_the_case_is_updated_once",
                "tests/system/test_mcp_gateway.py::test_the_example_agent_closes_and_emails_once_however_often_it_runs",
            )
        },
    ),
    "bdef7a5f1c": Shell(
        "opledger review list --tenant acme --older-than 2h --action 'email.*'",
        substitute=(("op_01J...", "{op}"),),
    ),
    "92a2df38bd": Shell(
        "OPLEDGER_DEV=1 OPLEDGER_CRASHPOINT=dispatch.after_call opledger worker    # die there",
        long_running=(
            "OPLEDGER_DEV=1 OPLEDGER_CRASHPOINT=dispatch.after_call opledger worker",
            "OPLEDGER_DEV=1 OPLEDGER_CRASHPOINT=dispatch.after_call:3 opledger worker",
            "OPLEDGER_DEV=1 OPLEDGER_CRASHPOINT=dispatch.before_call "
            "OPLEDGER_CRASHPOINT_SIGNAL=SIGSTOP opledger worker",
        ),
    ),
    "09cc3a909b": Shell(
        "opledger chaos --ops 200 --seed 7",
        covered={
            "opledger chaos --ops 200 --seed 7": (CHAOS_TEST,),
            "opledger chaos --ops 5000 --seed 42 --workers 2 --kill-every 1 --redis-restarts 3 "
            "--restart-postgres --chaos-seconds 300 --settle-timeout 900 --json": (CHAOS_TEST,),
        },
    ),
    "6f01e3a8ab": Shell(
        "opledger migrate                      # apply the ledger's migrations",
        long_running=("opledger sandbox --port 8025",),
        covered={
            # the fixture's operation is held for review, which no cancel may touch: the
            # CLI's test cancels a prepared one and is refused the others
            "opledger ops cancel op_01J... --reason wrong customer [--operator alice]": (
                "tests/integration/test_cli_ops.py::test_ops_cancel_records_who_and_refuses_in_one_line",
            ),
            "opledger demo [--keep]": (DEMO_TEST,),
            "opledger chaos --ops 200 --seed 7": (CHAOS_TEST,),
            "opledger bench [--quick] [--json]": (BENCH_TEST,),
            # switch 1 exists only after a failover: the command's own test makes one
            "opledger switches end 1 --operator alice": (SWITCHES_TEST,),
            # the console script's own test runs it as written and reads what it prints
            "opledger --version": ("tests/unit/test_version.py::test_opledger_version_prints_it",),
        },
        substitute=(
            ("op_01J...", "{op}"),
            ("--port 8025", "--port {port}"),  # the sandbox the contract check talks to
            ("[--keep]", "--keep"),
            ("[--quick] [--json]", "--quick --json"),
            ("[--operator alice]", "--operator alice"),
        ),
    ),
    "f75f8648aa": Shell(
        f"{EXAMPLE} run --thread t1",
        # it needs a worker on the ledger and the broker: the system test runs every
        # command with the shared worker and kills the agent mid-tool
        covered={
            f"{EXAMPLE} run --thread t1": (
                LANGGRAPH_TEST,
                LANGGRAPH_KILL_TEST,
                WHEEL_LANGGRAPH_TEST,
            ),
            f"{EXAMPLE} resume --thread t1": (LANGGRAPH_KILL_TEST,),
            f"{EXAMPLE} travel --thread t1 --to first-turn": (LANGGRAPH_TEST,),
            f"{EXAMPLE} travel --thread t1 --to first-tools": (LANGGRAPH_TEST,),
            f"{EXAMPLE} fork --thread t1 --owner new-owner@acme.test "
            "--authorization auth_onboarding_fork": (LANGGRAPH_TEST,),
        },
    ),
    "5f59eb06de": Python(
        "from opledger.agents import Effects",
        then="""
import os, redis
from opledger.agents import EffectPending
assert again.asked_before and [a.asked_by for a in ledger.asks(close.op_id)] == [
    "call_1", "call_7"
]
queued = redis.Redis.from_url(os.environ["OPLEDGER_BROKER_URL"]).lrange("dispatch", 0, -1)
assert any(close.op_id.encode() in message for message in queued), queued
assert not any(email.op_id.encode() in message for message in queued), queued  # waits
assert isinstance(email, EffectPending), email
assert [d.op_id for d in email.blocked_by] == [close.op_id], email
assert ledger.claim(email.op_id, owner="readme") is None
""",
    ),
    "3e7fefc901": Python(
        "from opledger.adapters.registry import load_registry",
        then="""
import os, redis
assert close.kind == "confirmed" and close.path == "inline", close
assert [a.owner.split(":")[0] for a in ledger.history(close.op_id).attempts] == ["inline"]
queued = redis.Redis.from_url(os.environ["OPLEDGER_BROKER_URL"]).lrange("dispatch", 0, -1)
assert not any(close.op_id.encode() in message for message in queued), queued
""",
    ),
    "fb4d824288": Shell(
        "opledger operator add alice --tenant acme --by root",
        # a password prompt, a password on stdin, a server until interrupted: the console's
        # own tests run these commands as real processes
        covered={
            "opledger operator add alice --tenant acme --by root": (f"{CONSOLE_ACCESS}::{OPS}",),
            "opledger operator add ops-admin --all-tenants --by root --password-stdin": (
                f"{CONSOLE_ACCESS}::{OPS}",
            ),
            "opledger operator add bob@corp --tenant globex --by root --sso-only": (
                f"{CONSOLE_ACCESS}::test_the_trusted_header_mode_trusts_only_the_proxy_and_known_operators",
            ),
            "opledger console": (f"{CONSOLE_ACCESS}::{SESSIONS}", CONSOLE_BROWSER),
            "opledger operator disable alice --by root": (f"{CONSOLE_ACCESS}::{SESSIONS}",),
        },
    ),
    "38aab4ae4c": Shell(
        "export OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318",
        # a worker exporting to a collector: the traces' system test runs real workers (and
        # an agent) exporting over OTLP/HTTP to a receiver of its own
        covered={"opledger worker": (TRACES_TEST,)},
    ),
    "a386f019ee": Python(
        "from opledger.observability import tracing",
        then="""
assert not tracing.enabled()  # nothing here asks for traces: configure() set nothing up
""",
    ),
    "171d64ffeb": Python(
        "import os",  # the "Using your own Celery app" block
        then="""
from celery import current_app
assert {"opledger.dispatch", "opledger.sweep"} <= set(theirs.tasks)
assert [q.name for q in theirs.conf.task_queues][-4:] == [
    "dispatch", "reconcile", "maintenance", "notifications"
]
assert "opledger-sweep" in theirs.conf.beat_schedule
assert current_app._get_current_object() is theirs
""",
    ),
    "ebfb315962": Covered("pip install 'opledger[console,metrics,sandbox]'", PIP_QUICKSTART_TEST),
    "f267b4a234": NotCode(
        "opledger/ledger/     the core, one module per part",
        "the directory layout",
    ),
    # -- docs/architecture.md
    "cb269fa2a7": NotCode("opledger.cli          the `opledger` command", "the layers"),
    "d7cfa6963b": NotCode("facades        the narrow protocols each caller", "the ledger's layers"),
    # -- docs/adapters.md
    "62bea7c34c": Shell("opledger adapter new tickets --dir myapp"),
    "0a1c91b3f8": Covered("def tickets_contract(", ADAPTER_EXCERPT),
    "b8da4e7907": Covered("#: the provider's error codes", ADAPTER_EXCERPT),
    "dcf3463ed8": Covered("    def __init__(", ADAPTER_EXCERPT),
    "74b409446e": Covered("    def dispatch(self, claim: Claim)", ADAPTER_EXCERPT),
    "e5a4171c0c": Covered("def _confirmed(response: httpx.Response)", ADAPTER_EXCERPT),
    "ea137a960b": Covered("    def lookup(self, operation: Operation", ADAPTER_EXCERPT),
    "5502e9d46f": Covered("class TicketsAdapter:", ADAPTER_EXCERPT),
    "9d2d435688": Covered("    def search_hint(self, operation", ADAPTER_EXCERPT),
    "02702d44b9": Covered("def build_registry(settings: Settings)", ADAPTER_EXCERPT),
    "81b36718aa": Covered('"""An adapter for Tickets', ADAPTER_EXCERPT),
    "12191047ac": Covered("def contacts_contract(", ADAPTER_EXCERPT),
    "e9fc204376": Covered("def middleware_outcome(", ADAPTER_EXCERPT),
    "89ba27d262": Covered("    def lookup(self, operation: Operation", ADAPTER_EXCERPT),
    "cfe75c6e8f": NotCode("the contract disagrees with the provider on:", "sample output"),
    "fd7425f47e": Shell(
        "export OPLEDGER_ADAPTERS=opledger.examples.adapter_tickets:build_registry",
        # a Tickets server at that URL, and the example importable: the guide's test runs
        # the contract check with this very setting against a server of its own
        covered={
            "opledger check": (
                CHECK_TEST,
                "tests/unit/test_load_registry.py::test_the_example_factory_says_what_it_misses",
            ),
            "opledger contract check tickets.open.v1": (
                f"{ADAPTER_GUIDE}::test_contract_check_agrees_with_a_server_that_keeps_the_promises",
            ),
        },
    ),
    # -- docs/email-evidence.md
    "bf237802f9": NotCode(
        "searched the folder 'Sent'", "a lookup's evidence, as a reviewer reads it"
    ),
    # -- docs/mcp.md
    "3a2df2da27": NotCode("workflow_id = mcp:<agent>:<run>", "how a call's intent is keyed"),
    "64b3c1f71f": Shell("opledger mcp token --agent onboarding --tenant acme"),
    "4da155b573": Shell(
        "OPLEDGER_MCP_CLIENTS=mcp-clients.json opledger mcp serve --port 8765",
        # servers until stopped; the stdio one needs a client on its other end
        covered={
            "OPLEDGER_MCP_CLIENTS=mcp-clients.json opledger mcp serve --port 8765": (
                MCP_GATEWAY_TESTS
            ),
            "OPLEDGER_MCP_CLIENTS=mcp-clients.json OPLEDGER_MCP_TOKEN=... opledger mcp serve "
            "--transport stdio": (
                "tests/integration/test_mcp_stdio.py::test_stdio_serves_the_caller_its_token_names",
            ),
        },
    ),
    "12db333489": Shell(
        "opledger mcp token --agent desk --tenant acme --grant auth_acme --run token"
    ),
    "b6b5abeaa2": NotCode(
        "{",
        "a desktop host's configuration: its stdio launch with these variables is "
        "tests/system/test_mcp_hosts.py's",
    ),
    "a932b7e9dd": NotCode(
        "const result = await client.callTool({",
        "an excerpt of examples/mcp_host.mjs, which tests/system/test_mcp_hosts.py runs on node",
    ),
    "2889f493d2": Covered(
        "from agents import Agent, Runner",
        "tests/integration/test_mcp_agents_sdk.py::"
        "test_the_agents_sdk_lists_the_gateways_tools_for_the_model_and_calls_one_once",
    ),
    "9053811b13": NotCode('{"url": "http://127.0.0.1:9000/mcp"', "the upstream file's format"),
    "1b46e2e4bb": Shell(
        "export OPLEDGER_ADAPTERS=opledger.adapters.mcp:build_registry",
        # an upstream MCP server behind upstream.json: the proxy's system tests run a
        # worker with this registry and the proxy in front of an MCP SDK server
        covered={
            "opledger worker &": MCP_PROXY_TESTS,
            "opledger mcp proxy --port 8766": MCP_PROXY_TESTS,
        },
    ),
    # -- docs/pydantic-ai.md
    "6b758b6341": Python(
        "from dataclasses import dataclass",
        then="""
from pydantic_ai import Tool
assert isinstance(close_case, Tool) and close_case.name == "close_case"
assert set(close_case.tool_def.parameters_json_schema["properties"]) == {"case_id", "repeat"}
""",
    ),
    "61ce33e1e4": Shell(
        "python -m opledger.examples.pydantic_ai_support run --ticket t1",
        # it needs a worker on the ledger and the broker: the system test runs each command
        # with the shared worker, kills the agent mid-tool and lets DBOS recover it
        covered={
            "python -m opledger.examples.pydantic_ai_support run --ticket t1": (PAI_RUN, PAI_KILL),
            "python -m opledger.examples.pydantic_ai_support resume --ticket t1": (PAI_KILL,),
            "python -m opledger.examples.pydantic_ai_support run --ticket t2 --dbos": (PAI_KILL,),
            "python -m opledger.examples.pydantic_ai_support resume --ticket t2 --dbos": (
                PAI_KILL,
            ),
        },
    ),
    # -- docs/openai-agents.md
    "871d18cfed": Python(
        "from agents import Agent",
        then="""
from agents import FunctionTool
assert isinstance(close_case, FunctionTool) and close_case.name == "close_case"
assert "case_id" in close_case.params_json_schema["properties"]
assert agent.tools == [close_case]
""",
    ),
    "e63b032605": Shell(
        "python -m opledger.examples.openai_agents_support run --session s1",
        # a worker on the ledger and the broker: the system test runs each command with the
        # shared worker and kills the agent mid-tool
        covered={
            f"{OAI} run --session s1": (OAI_RUN, OAI_KILL),
            f"{OAI} resume --session s1": (OAI_KILL,),
            f"{OAI} retry --session s1": (OAI_RUN,),
            f"{OAI} run --session s2 --approval --state s2.json": (OAI_APPROVAL,),
            f"{OAI} approve --session s2 --state s2.json": (OAI_APPROVAL,),
        },
    ),
    # -- docs/approvals.md
    "107ea1775f": Python(
        "from opledger.adapters.stripe import StripeAdapter",
        then="""
from opledger.adapters.registry import Registry
registry = Registry([RefundsAdapter("http://127.0.0.1:9", api_key="sk_test_123")])
policy = registry.approval_policy("stripe.refund.v1")
from opledger.ledger.approval_policy import requirement
assert requirement(policy, "ch_1", {"amount": 20000}) is not None
assert requirement(policy, "ch_1", {"amount": 500}) is None
assert requirement(policy, "ent-7", {"amount": 500}) is not None
""",
    ),
    "111bd40ed6": NotCode("{", "OPLEDGER_APPROVAL_POLICIES' document: read by its unit tests"),
    "cf32577fc7": NotCode(
        "$ opledger approvals list --tenant acme",
        "the commands with a made-up op id and digest: "
        "tests/integration/test_cli_approvals.py runs each with a real one",
    ),
    # -- docs/webhooks.md
    "fa56043616": Covered(
        "{",
        "tests/integration/test_approval_notices.py::test_the_docs_show_the_body_as_it_is",
    ),
    "24bcd652d0": NotCode("POST /your/path HTTP/1.1", "a request as the receiver gets it"),
    "2890f30fcd": Covered(
        '"""Verify an opledger review webhook',
        "tests/integration/test_webhook_signatures.py::test_the_docs_show_the_example_receiver_as_it_is",
    ),
    # -- docs/benchmarks.md
    "a0549272e1": NotCode("claim    Execution 0.58 ms", "a query plan's summary"),
    "b9fb268cff": Shell(
        "opledger chaos --ops 10000 --seed 2026",
        covered={
            "opledger chaos --ops 10000 --seed 2026 --workers 2 --kill-every 2 --redis-restarts 4 "
            "--restart-postgres --chaos-seconds 600 --settle-timeout 1800 --json": (CHAOS_TEST,)
        },
    ),
    "31585465d1": Shell(
        "make bench",
        covered={
            "make bench": (BENCH_TEST,),
            ".venv/bin/opledger bench --agents": (AGENTS_BENCH_TEST,),
            ".venv/bin/opledger bench --agents --quick": (AGENTS_BENCH_TEST,),
            ".venv/bin/opledger bench --backlog-only --backlog 20000": (BENCH_TEST,),
            ".venv/bin/opledger bench --quick --json": (BENCH_TEST,),
            ".venv/bin/opledger bench --concurrency 4": (BENCH_TEST,),
            ".venv/bin/opledger bench --backlog 0 --concurrencies 0 --tenants 0": (BENCH_TEST,),
        },
    ),
}


def verdict_of(block: Block) -> Verdict:
    verdict = BLOCKS.get(block.key)
    assert verdict is not None, (
        f"{block.where}: a new block needs a way to be tested: add "
        f"{block.key!r} (```{block.lang}, first line {block.first!r}) to BLOCKS in "
        f"{Path(__file__).name}"
    )
    assert block.first.startswith(verdict.first), (block.where, verdict.first, block.first)
    return verdict


# -- running them -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process started in a session of its own, and whatever it started (killed if
    it takes more than a moment: its shutdown is not what is being checked)."""
    for sig, wait in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + wait
        try:
            os.killpg(proc.pid, sig)
            while time.monotonic() < deadline:
                proc.poll()  # reaped, the leader no longer counts as one of the group
                os.killpg(proc.pid, 0)  # anyone left?
                time.sleep(0.05)
        except ProcessLookupError:
            break
    proc.wait(timeout=5)


def _tail(path: Path, chars: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-chars:]


@dataclass
class Outcome:
    what: str
    problem: str | None = None


def run_script(where: str, script: str, env: dict[str, str], workdir: Path) -> Outcome:
    """`bash -euxo pipefail` over the commands, in `workdir`; every process it left
    running in the background is stopped afterwards."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "block.sh").write_text(script + "\n")
    out, err = workdir / "stdout", workdir / "stderr"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            ["bash", "-euxo", "pipefail", "block.sh"],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=o,
            stderr=e,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=SCRIPT_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _stop(proc)
    if code == 0:
        return Outcome(where)
    said = "timed out" if code is None else f"exited {code}"
    return Outcome(
        where,
        f"{said}\n--- script\n{script}\n--- stdout\n{_tail(out)}\n--- stderr\n{_tail(err)}",
    )


def run_long(where: str, command: str, env: dict[str, str], workdir: Path) -> Outcome:
    """Start a long-running command as written; it must get ready (or still run after the
    grace period, or exit 0), and is then stopped."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "output"
    ready = READY[Command(command).program[1]]
    with out.open("wb") as o:
        proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=o,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + LONG_RUNNING_GRACE
            while time.monotonic() < deadline and proc.poll() is None:
                if ready.search(out.read_text(errors="replace")):
                    break
                time.sleep(0.2)
            code = proc.poll()
        finally:
            _stop(proc)
    if code in (None, 0):
        return Outcome(where)
    return Outcome(where, f"{command!r} exited {code}\n{_tail(out)}")


def parses(words: list[str]) -> None:
    """`opledger ARGS` resolves to a command whose options all exist (nothing runs)."""
    assert words[0] == "opledger", words
    command: Any = typer.main.get_command(cli_app)
    try:
        ctx = command.make_context("opledger", words[1:])
    except typer.Exit as done:  # an eager option (--version) answered: it parsed
        assert done.exit_code == 0, words
        return
    while hasattr(command, "resolve_command"):  # a group: on to the subcommand
        protected = getattr(ctx, "protected_args", None) or getattr(ctx, "_protected_args", [])
        name, command, rest = command.resolve_command(ctx, [*protected, *ctx.args])
        ctx = command.make_context(name, rest, parent=ctx)


def names_a_test(node: str) -> bool:
    """`node` ("tests/...py::test_name") is a test function of this repository."""
    path, _, name = node.partition("::")
    file = REPO / path
    found = (
        re.search(rf"^def {re.escape(name)}\(", file.read_text(), re.M) if file.is_file() else None
    )
    return name.startswith("test_") and found is not None


def make_dry_run(*targets: str) -> subprocess.CompletedProcess[str]:
    """`make -n TARGETS` in the repository: what they would run, nothing run."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(
        ["make", "-n", "-C", str(REPO), *targets], capture_output=True, text=True, env=env
    )


@dataclass
class Plan:
    """A shell block's commands, the placeholders replaced, by how they are verified."""

    run: list[Command]  # as written, in order, by one `bash -euo pipefail`
    long_running: list[Command]
    covered: list[tuple[str, Command]]  # (the table's key, the command)


def plan(block: Block, verdict: Shell, values: Mapping[str, str]) -> Plan:
    commands = block.commands()
    texts = [c.text for c in commands]
    for name in (*verdict.long_running, *verdict.covered):
        assert name in texts, f"{block.where}: BLOCKS names {name!r}, not in the block"
    for placeholder, _ in verdict.substitute:
        assert placeholder in block.text, f"{block.where}: no {placeholder!r} to replace"

    def substituted(command: Command) -> Command:
        raw = command.raw
        for placeholder, replacement in verdict.substitute:
            raw = raw.replace(placeholder, replacement.format(**values))
        return Command(raw)

    return Plan(
        run=[
            substituted(c)
            for c in commands
            if c.text not in verdict.long_running and c.text not in verdict.covered
        ],
        long_running=[substituted(c) for c in commands if c.text in verdict.long_running],
        covered=[(c.text, substituted(c)) for c in commands if c.text in verdict.covered],
    )


#: runs each page's Python blocks in one namespace of that page's own, pages one after the
#: other, the page's line numbers in any traceback
DRIVER = r"""
import json, sys, traceback

namespaces = {}
for block in json.load(open(sys.argv[1])):
    where = f"{block['page']}:{block['line']}"
    ns = namespaces.setdefault(block["page"], {"__name__": "__main__"})
    try:
        exec(compile("\n" * block["line"] + block["text"], block["page"], "exec"), ns)
    except BaseException:
        print(f"{where}: the block failed as written", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
    if block["then"]:
        try:
            exec(compile(block["then"], f"<checks after {where}>", "exec"), dict(ns))
        except BaseException:
            print(f"{where}: the block ran, but did not do what it says", file=sys.stderr)
            traceback.print_exc()
            sys.exit(2)
"""


#: parses argument lists of an example agent, the module argv[1] (a JSON list of lists, argv[2])
#: with the example's own parser, in one process (the example imports its framework: seconds of
#: CPU each time): `main` is stopped right after its parse, before it touches anything. A
#: list that does not parse is named on stderr, with argparse's message, and exits 1.
EXAMPLE_PARSES = r"""
import argparse, importlib, json, sys

sys.argv[0] = sys.argv[1]  # argparse names it in its messages
example = vars(importlib.import_module(sys.argv[1]))  # defines, does not run


class Parsed(Exception):
    pass


def parse_then_stop(self, args=None, namespace=None):
    raise Parsed(parse(self, args, namespace))


parse = argparse.ArgumentParser.parse_args
argparse.ArgumentParser.parse_args = parse_then_stop
bad = 0
for argv in json.loads(sys.argv[2]):
    try:
        example["main"](argv)
    except Parsed:
        continue
    except SystemExit as exc:  # argparse's error (its message above), or --help
        print(f"{argv!r}: does not parse (exit {exc.code})", file=sys.stderr)
    else:
        print(f"{argv!r}: main() returned without parsing its arguments", file=sys.stderr)
    bad += 1
sys.exit(1 if bad else 0)
"""


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def broker_server(redis_server: str) -> str:
    """Database 14 of the machine's Redis, or of a private one (tests/conftest.py)."""
    return f"{redis_server}/14"


@pytest.fixture
def broker(broker_server: str) -> Iterator[str]:
    """The broker, empty before and after."""
    client = redis.Redis.from_url(broker_server)
    client.flushdb()
    yield broker_server
    client.flushdb()
    client.close()


@pytest.fixture
def readme_env(ledger: Ledger, database_url: str, broker: str, sandbox: Sandbox) -> dict[str, str]:
    """What a reader has set up: the ledger's database (migrated, emptied), the broker, the
    providers (the sandbox) and the virtualenv on PATH; no other OPLEDGER_ setting."""
    env = unconfigured_environ()
    env.update(
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        COLUMNS="120",
        OPLEDGER_DATABASE_URL=database_url,
        OPLEDGER_BROKER_URL=broker,
        OPLEDGER_CRM_URL=sandbox.http_url,
        OPLEDGER_EMAIL_URL=sandbox.http_url,
        OPLEDGER_SMTP_HOST=sandbox.smtp_host,
        OPLEDGER_SMTP_PORT=str(sandbox.smtp_port),
    )
    return env


@pytest.fixture
def values(ledger: Ledger) -> dict[str, str]:
    """The placeholders' values: an operation of tenant acme held for review (its response
    was lost), free ports, a Flower password."""
    ref = ledger.grant(tenant="acme", scope=["crm.*"], granted_by="readme", ref="auth_readme").ref
    op = ledger.prepare(
        tenant="acme",
        workflow_id="readme",
        intent_key="close-case",
        action="crm.close_case.v1",
        target="case-318",
        payload={"note": "resolved"},
        authorization_ref=ref,
    )
    claim = ledger.claim(op.id, owner="readme", lease=timedelta(seconds=30))
    assert claim is not None
    lost = Ambiguous(code="timeout", reason="the response was lost")
    unknown = ledger.record_outcome(claim, lost)
    assert ledger.open_review(op.id, fence=unknown.fence, reason="nothing can tell") is not None
    return {
        "op": op.id,
        "port": str(_free_port()),
        "flower_port": str(_free_port()),
        "flower_password": "readme-test",
    }


# -- the tests ----------------------------------------------------------------------------


def test_every_block_is_known_and_every_entry_is_a_block() -> None:
    assert page_blocks(README), "README.md has no code blocks?"
    assert len(pages()) > 1, "no docs pages?"
    blocks = all_blocks()
    unknown = [b for b in blocks if b.key not in BLOCKS]
    assert not unknown, "\n".join(
        f"{b.where}: a new block needs a way to be tested: add "
        f"{b.key!r} (```{b.lang}, first line {b.first!r}) to BLOCKS"
        for b in unknown
    )
    stale = set(BLOCKS) - {b.key for b in blocks}
    assert not stale, f"BLOCKS names blocks no page has any more: {sorted(stale)}"
    for block in blocks:
        verdict = verdict_of(block)
        if block.lang == "python":
            assert isinstance(verdict, Python | Covered), block.where
        elif isinstance(verdict, Shell):
            assert block.lang == "sh", block.where


def test_the_extraction_finds_every_kind_of_fence() -> None:
    text = (
        "a\n```python\nx = 1\n```\n\n```sh\necho a \\\n  b  # c\n# d\n```\n```\nout\n```\n"
        "- a list item:\n\n  ```\n  in the list\n    indented more\n  ```\n"
    )
    blocks = page_blocks(DOCS / "page.md", text)
    assert [(b.where, b.lang, b.text) for b in blocks] == [
        ("docs/page.md:2", "python", "x = 1"),
        ("docs/page.md:6", "sh", "echo a \\\n  b  # c\n# d"),
        ("docs/page.md:11", "", "out"),
        ("docs/page.md:16", "", "in the list\n  indented more"),
    ]
    assert [c.text for c in blocks[1].commands()] == ["echo a b"]


def test_the_python_blocks_run_in_order_in_one_session(
    readme_env: dict[str, str], ledger: Ledger, tmp_path: Path
) -> None:
    blocks = [
        {"page": b.page, "line": b.line, "text": b.text, "then": verdict.then}
        for b in all_blocks()
        if isinstance(verdict := verdict_of(b), Python)
    ]
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    try:
        run = subprocess.run(
            [sys.executable, "-c", DRIVER, "blocks.json"],
            cwd=tmp_path,
            env=readme_env,
            capture_output=True,
            text=True,
            timeout=SCRIPT_TIMEOUT,
        )
    finally:
        with ledger.engine.begin() as conn:  # the outbox example's business table
            conn.execute(text(f"DROP TABLE IF EXISTS {OUTBOX_TABLE}"))
    if run.returncode:
        pytest.fail(run.stderr[-6000:], pytrace=False)


@pytest.mark.timeout(300)  # about 40 s; more on a busy machine, each job has its own timeout
def test_the_shell_blocks_run_as_written(
    readme_env: dict[str, str], values: dict[str, str], tmp_path: Path
) -> None:
    """Every block's commands and every long-running process, side by side."""
    jobs: list[tuple[Callable[[str, str, dict[str, str], Path], Outcome], str, str, Path]] = []
    seen: set[str] = set()
    shells = [
        (block, plan(block, verdict, values), tmp_path / block.page.replace("/", "_"))
        for block in all_blocks()
        if isinstance(verdict := verdict_of(block), Shell)
    ]
    for block, steps, here in shells:
        script = [c.raw for c in steps.run if c.text not in seen]
        seen.update(c.text.removesuffix(" &") for c in steps.run)
        if script:
            jobs.append((run_script, block.where, "\n".join(script), here / f"block{block.line}"))
    for block, steps, here in shells:
        for n, command in enumerate(steps.long_running):
            if command.text in seen:
                # a block runs it (in the background, and uses it: `opledger sandbox
                # --port ...`), or it was started once already
                continue
            seen.add(command.text)
            where = f"{block.where} (long-running)"
            jobs.append((run_long, where, command.raw, here / f"block{block.line}" / f"long{n}"))
    jobs.sort(key=lambda job: -len(job[2].splitlines()))  # the longest script first
    with ThreadPoolExecutor(max_workers=LANES) as pool:
        futures = [pool.submit(fn, where, what, readme_env, here) for fn, where, what, here in jobs]
        outcomes = [f.result() for f in futures]
    problems = [f"{o.what}: {o.problem}" for o in outcomes if o.problem]
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


def test_covered_commands_name_real_tests_and_still_parse() -> None:
    values = dict.fromkeys(("op", "port", "flower_port", "flower_password"), "1")
    example_argvs: dict[str, list[list[str]]] = {}  # per example, parsed in one process each
    for block in all_blocks():
        verdict = verdict_of(block)
        if isinstance(verdict, Covered):
            assert names_a_test(verdict.test), f"{block.where}: no test {verdict.test}"
            continue
        if not isinstance(verdict, Shell):
            continue
        for key, command in plan(block, verdict, values).covered:
            for node in verdict.covered[key]:
                assert names_a_test(node), f"{block.where}: {key!r}: no test {node}"
            words = command.program
            if words[-1] == "&":  # started in the background: the shell's, not an argument
                words = words[:-1]
            if words[0] == "opledger" or words[0].endswith("/bin/opledger"):
                parses(["opledger", *words[1:]])
            elif words[:2] == ["python", "-m"] and words[2].startswith("opledger.examples."):
                example_argvs.setdefault(words[2], []).append(words[3:])
            elif words[0] == "make":
                dry = make_dry_run(*words[1:])
                assert dry.returncode == 0, (key, dry.stderr)
                if words[1:] in (["demo"], ["bench"]):  # what the demo's and bench's tests run
                    assert f"bin/opledger {words[1]}" in dry.stdout, dry.stdout
    assert sorted(example_argvs) == [  # each agent example's documented commands
        "opledger.examples.langgraph_onboarding",
        "opledger.examples.openai_agents_support",
        "opledger.examples.pydantic_ai_support",
    ]
    for module, argvs in example_argvs.items():
        example = subprocess.run(
            [sys.executable, "-c", EXAMPLE_PARSES, module, json.dumps(argvs)],
            capture_output=True,
            text=True,
        )
        assert example.returncode == 0, (module, example.stderr)


def test_make_test_runs_lint_types_contracts_and_the_suite() -> None:
    """`make test` is what runs this suite: it is covered by running at all; what it runs
    is what the README says (ruff, mypy, import-linter, then the whole suite)."""
    dry = make_dry_run("test")
    assert dry.returncode == 0, dry.stderr
    steps = [
        line.split()[0].rsplit("/", 1)[-1] for line in dry.stdout.splitlines() if "/bin/" in line
    ]
    assert [s for s in steps if s in ("ruff", "mypy", "lint-imports", "pytest")] == [
        "ruff",
        "ruff",
        "mypy",
        "lint-imports",
        "pytest",
    ], dry.stdout


def test_every_setting_is_in_the_configuration_table() -> None:
    """Each setting a process reads is a row of the configuration reference's table."""
    from opledger.settings import Settings

    reference = DOCS / "configuration.md"
    rows = [line for line in reference.read_text().splitlines() if line.startswith("| `OPLEDGER_")]
    listed = " ".join(rows)
    variables = [f"OPLEDGER_{name.upper()}" for name in Settings.model_fields]
    assert [v for v in variables if f"`{v}`" not in listed] == []
