"""`opledger example [NAME] [--to DIR]`: the examples shipped with the package.

They are the package `opledger.examples` (the repository's examples/ directory): an
adapter, the LangGraph and MCP agents, a webhook receiver, and whatever else is there.
Without NAME the command lists them, one line each (the file and the first sentence it
says about itself); with NAME it writes that file into DIR, refusing to overwrite one that
exists unless told (`--force`). A Python example also runs where it is installed:
`python -m opledger.examples.NAME ...`.

The files are read as files (`importlib.resources`), never imported: an example may need
an extra (LangGraph, the MCP SDK) that this install does not have, and nothing of opledger
imports them (tests/unit/test_cli_examples.py checks that).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Annotated

import typer

from opledger.cli.failures import REFUSED

from .app import app

PACKAGE = "opledger.examples"

#: a comment line's marker in a file that is not Python (JavaScript, shell, YAML, ...)
_COMMENT = re.compile(r"^\s*(?://+|/\*+|\*+/?|#+)\s?")


@dataclass(frozen=True)
class Example:
    name: str  # the file's name, e.g. langgraph_onboarding.py
    summary: str  # the first sentence it says about itself ("" when it says nothing)
    use: str | None  # how it is used where it is installed, for a Python module
    source: Traversable

    @property
    def stem(self) -> str:
        return self.name.rsplit(".", 1)[0]


def shipped() -> list[Example]:
    """Every example file of the installed package, by name: each file of its directory
    but the package's own (`__init__.py`) and hidden ones."""
    root = resources.files(PACKAGE)
    found = []
    for entry in root.iterdir():
        if entry.is_file() and not entry.name.startswith(("_", ".")):
            text = entry.read_text(encoding="utf-8")
            found.append(
                Example(entry.name, summary(entry.name, text), use(entry.name, text), entry)
            )
    return sorted(found, key=lambda example: example.name)


def use(name: str, text: str) -> str | None:
    """How a Python example is used where it is installed: a script (`if __name__ ==
    "__main__"`) runs as `python -m opledger.examples.NAME`, an adapter module with a
    registry factory is named in OPLEDGER_ADAPTERS; None for anything else."""
    if not name.endswith(".py"):
        return None
    module = f"{PACKAGE}.{name.removesuffix('.py')}"
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return f"python -m {module}"
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "build_registry":
            return f"OPLEDGER_ADAPTERS={module}:build_registry"
    return None


def _first_sentence(text: str) -> str:
    paragraph = " ".join(text.strip().split("\n\n", 1)[0].split())
    found = re.search(r"[.!?](?=\s|$)", paragraph)
    return paragraph[: found.end()] if found else paragraph


def summary(name: str, text: str) -> str:
    """The first sentence an example says about itself: a Python file's docstring, a JSON
    document's "description", else the comment lines at the top of the file."""
    if name.endswith(".py"):
        try:
            doc = ast.get_docstring(ast.parse(text))
        except SyntaxError:
            doc = None
        return _first_sentence(doc or "")
    if name.endswith(".json"):
        try:
            document = json.loads(text)
        except ValueError:
            document = None
        described = document.get("description") if isinstance(document, dict) else None
        return _first_sentence(described) if isinstance(described, str) else ""
    lines = text.splitlines()
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    comment: list[str] = []
    for line in lines:
        marker = _COMMENT.match(line)
        if marker is None:
            break
        comment.append(line[marker.end() :].rstrip("*/ "))
    return _first_sentence("\n".join(comment))


def find(examples: list[Example], name: str) -> Example:
    """The example NAME names: a file's name, or its name without the suffix when one
    file has it."""
    exact = [e for e in examples if e.name == name]
    matches = exact or [e for e in examples if e.stem == name]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise typer.BadParameter(
            f"{name!r} names {', '.join(e.name for e in matches)}: give the file's whole name"
        )
    names = ", ".join(e.name for e in examples) or "none"
    raise typer.BadParameter(f"no example {name!r}; the examples: {names}")


@app.command("example")
def example(
    name: Annotated[
        str | None,
        typer.Argument(
            help="An example's file name (the .py may be left out); without it, list them."
        ),
    ] = None,
    to: Annotated[
        Path, typer.Option("--to", help="Where to write it (a directory, created if missing).")
    ] = Path("."),
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite a file of that name in --to.")
    ] = False,
) -> None:
    """List the examples shipped with opledger, one line each, or write example NAME into
    --to (refusing to overwrite a file that exists unless --force)."""
    examples = shipped()
    if name is None:
        width = max((len(e.name) for e in examples), default=0)
        for each in examples:
            typer.echo(f"{each.name:<{width}}  {each.summary}".rstrip())
        typer.echo(
            "\nA script runs where it is installed (python -m opledger.examples.NAME, with "
            "the extras it names); opledger example NAME [--to DIR] writes one out."
        )
        return
    chosen = find(examples, name)
    target = to / chosen.name
    if target.exists() and not force:
        typer.echo(
            f"opledger: refused: {target} exists; nothing was written (--force overwrites it)",
            err=True,
        )
        raise typer.Exit(REFUSED)
    to.mkdir(parents=True, exist_ok=True)
    target.write_bytes(chosen.source.read_bytes())
    typer.echo(f"wrote {target}" + (f" (as installed: {chosen.use})" if chosen.use else ""))
