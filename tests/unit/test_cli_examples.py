"""`opledger example`: every file of the repository's examples/ is listed (it is the package
`opledger.examples`, as an installed wheel has it: tests/system/test_wheel.py runs the same
from the wheel), one line each, and written out as it is, an existing file overwritten only
with --force. And nothing of opledger imports the examples."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opledger.cli.examples import Example, find, summary, use
from opledger.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _example_files() -> list[Path]:
    return sorted(
        p for p in EXAMPLES.iterdir() if p.is_file() and not p.name.startswith(("_", "."))
    )


def test_the_list_names_every_file_of_examples_with_what_it_says_of_itself() -> None:
    run = CliRunner().invoke(app, ["example"])
    assert run.exit_code == 0, run.output
    lines = run.stdout.split("\n\n")[0].splitlines()
    files = _example_files()
    assert len(files) >= 5
    assert [line.split()[0] for line in lines] == [p.name for p in files]
    for line, path in zip(lines, files, strict=True):
        said = summary(path.name, path.read_text())
        if path.suffix == ".py":
            assert said, f"{path.name} has no docstring to list it by"
        assert line.split(None, 1)[1:] == ([said] if said else []), line
    assert "python -m opledger.examples.NAME" in run.stdout


def test_an_example_is_written_as_it_is_and_not_over_a_file_unless_forced(
    tmp_path: Path,
) -> None:
    source = EXAMPLES / "langgraph_onboarding.py"
    to = tmp_path / "new" / "dir"
    run = CliRunner().invoke(app, ["example", "langgraph_onboarding", "--to", str(to)])
    assert run.exit_code == 0, run.output
    written = to / "langgraph_onboarding.py"
    assert written.read_bytes() == source.read_bytes()
    assert "python -m opledger.examples.langgraph_onboarding" in run.stdout

    written.write_text("mine")
    again = CliRunner().invoke(app, ["example", "langgraph_onboarding.py", "--to", str(to)])
    assert again.exit_code == 3, again.output
    assert "refused" in again.stderr and "--force" in again.stderr
    assert written.read_text() == "mine"

    forced = CliRunner().invoke(
        app, ["example", "langgraph_onboarding.py", "--to", str(to), "--force"]
    )
    assert forced.exit_code == 0, forced.output
    assert written.read_bytes() == source.read_bytes()


def test_an_adapter_example_says_how_it_is_configured(tmp_path: Path) -> None:
    run = CliRunner().invoke(app, ["example", "adapter_tickets", "--to", str(tmp_path)])
    assert run.exit_code == 0, run.output
    assert "OPLEDGER_ADAPTERS=opledger.examples.adapter_tickets:build_registry" in run.stdout


def test_an_unknown_or_ambiguous_name_is_a_usage_error(tmp_path: Path) -> None:
    run = CliRunner().invoke(app, ["example", "nope", "--to", str(tmp_path)])
    assert run.exit_code == 2, run.output
    assert "langgraph_onboarding.py" in run.stderr  # the names it knows
    assert not any(tmp_path.iterdir())
    two = [
        Example("mcp_agent.py", "", None, EXAMPLES / "__init__.py"),
        Example("mcp_agent.mjs", "", None, EXAMPLES / "__init__.py"),
    ]
    with pytest.raises(Exception, match="give the file's whole name"):
        find(two, "mcp_agent")
    assert find(two, "mcp_agent.mjs") is two[1]


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("a.py", '"""One. Two."""\nx = 1\n', "One."),
        ("a.py", '"""Over\ntwo lines: one sentence\n\nMore."""', "Over two lines: one sentence"),
        (
            "a.mjs",
            "#!/usr/bin/env node\n// An agent in\n// Node. More.\nlet x;\n",
            "An agent in Node.",
        ),
        ("a.mjs", "/**\n * Block comment. More.\n */\nexport {}\n", "Block comment."),
        ("a.json", '{"description": "A clients file. For MCP."}', "A clients file."),
        ("a.json", "[1, 2]", ""),
        ("a.txt", "no comment here\n", ""),
    ],
)
def test_what_a_file_says_of_itself(name: str, text: str, said: str) -> None:
    assert summary(name, text) == said


def test_how_a_python_example_is_used_where_it_is_installed() -> None:
    assert use("s.py", 'def main(): ...\nif __name__ == "__main__":\n    main()\n') == (
        "python -m opledger.examples.s"
    )
    assert use("a.py", "def build_registry(settings): ...\n") == (
        "OPLEDGER_ADAPTERS=opledger.examples.a:build_registry"
    )
    assert use("v.py", "def verify(): ...\n") is None
    assert use("x.mjs", "") is None


def _imported(path: Path) -> set[str]:
    """The absolute names of the modules a file of opledger imports."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = (
                node.module
                if node.level == 0
                else ".".join(part for part in (base, node.module) if part)
            )
            names.add(str(module))
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_nothing_of_opledger_imports_the_examples() -> None:
    """import-linter cannot say it: its graph holds the modules under opledger/ on disk,
    and `opledger.examples` lives in examples/."""
    found = {
        str(path.relative_to(ROOT)): name
        for path in sorted((ROOT / "opledger").rglob("*.py"))
        for name in _imported(path)
        if name.split(".")[0] == "examples" or name.startswith("opledger.examples")
    }
    assert found == {}
    # the check reads relative imports right: the command's module is not the package
    assert "opledger.cli.examples" in _imported(ROOT / "opledger" / "cli" / "main.py")
