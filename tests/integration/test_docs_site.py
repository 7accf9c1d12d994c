"""The docs site as a test: it builds strictly, the README's links lead somewhere, the
numbered rules are where the code and the tests say, and the presets' sources are shown.

The fenced blocks of the README and of the docs pages are tests/integration/test_readme.py's.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from opledger.adapters.presets import PRESETS

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
RULES = DOCS / "rules.md"
MKDOCS = Path(sys.executable).parent / "mkdocs"

LINK = re.compile(r"\]\(([^)\s]+)\)")
RULE_ANCHOR = re.compile(r'<a id="rule-(\d+)"></a>')
#: a citation of a numbered rule in the code or the tests: "rule 7", "rules 1, 2 and 11"
CITED = re.compile(r"\b[Rr]ules? ((?:\d+(?:-\d+)?(?:, | and |, and )?)+)")


def anchors(page: Path) -> set[str]:
    """What a link may name after `#` on a page: its headings (as MkDocs and GitHub make
    them, for the headings these pages use) and its explicit `<a id>`s."""
    text = page.read_text()
    ids = set(re.findall(r'<a id="([^"]+)"></a>', text))
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
        ids.add(re.sub(r"[\s]+", "-", slug))
    return ids


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """`make docs`'s build: a warning, a broken link or anchor, a docstring the API
    reference cannot read fails it."""
    build = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    built = tmp_path / "site"
    assert (built / "rules" / "index.html").is_file()
    cli = (built / "cli" / "index.html").read_text()
    assert 'id="opledger-ops-list"' in cli and "--older-than" in cli  # generated, with options
    api = (built / "api" / "ledger" / "index.html").read_text()
    assert 'id="opledger.ledger.Ledger.prepare"' in api  # from the docstrings


def test_the_readmes_links_lead_to_files_and_anchors_that_exist() -> None:
    targets = [t for t in LINK.findall(README.read_text()) if "://" not in t]
    assert any(t.startswith("docs/") for t in targets), targets
    for target in targets:
        path, _, anchor = target.partition("#")
        file = REPO / path
        assert file.exists(), f"README.md links to {path}, which does not exist"
        if anchor:
            assert anchor in anchors(file), f"README.md links to {target}: no such anchor"


def test_every_page_of_the_docs_is_in_the_site_or_linked_from_the_readme() -> None:
    """A page added to docs/ is in mkdocs.yml's nav (the strict build refuses one left
    out), and the README's map names every page of it but the API reference."""
    readme = README.read_text()
    nav = (REPO / "mkdocs.yml").read_text()
    for page in sorted(DOCS.glob("*.md")):
        name = page.relative_to(DOCS).as_posix()
        assert f": {name}" in nav, f"docs/{name} is not in mkdocs.yml's nav"
        if name != "index.md":
            assert f"](docs/{name})" in readme, f"the README's map leaves out docs/{name}"


def test_the_rules_page_numbers_each_rule_once_with_its_anchor() -> None:
    text = RULES.read_text()
    numbers = [int(n) for n in RULE_ANCHOR.findall(text)]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    headings = [int(n) for n in re.findall(r"^### Rule (\d+)\. ", text, re.M)]
    assert headings == numbers


def test_every_rule_the_code_and_the_tests_cite_is_on_the_rules_page() -> None:
    """A citation of rule 14 in a comment, with thirteen rules on the page, cites nothing."""
    known = {int(n) for n in RULE_ANCHOR.findall(RULES.read_text())}
    cited: dict[int, list[str]] = {}
    for file in sorted([*(REPO / "opledger").rglob("*.py"), *(REPO / "tests").rglob("*.py")]):
        if file == Path(__file__):
            continue  # its own examples
        for match in CITED.finditer(file.read_text()):
            for part in re.findall(r"\d+(?:-\d+)?", match.group(1)):
                low, _, high = part.partition("-")
                for n in range(int(low), int(high or low) + 1):
                    cited.setdefault(n, []).append(file.relative_to(REPO).as_posix())
    assert cited, "no citation found: has the way rules are cited changed?"
    unknown = {n: files for n, files in cited.items() if n not in known}
    assert not unknown, f"cited rules that docs/rules.md does not have: {unknown}"


def test_the_design_is_cited_where_it_is() -> None:
    """The code and the tests cite the rules page, never a file the repository lacks."""
    for file in sorted([*(REPO / "opledger").rglob("*.py"), *(REPO / "tests").rglob("*.py")]):
        if file == Path(__file__):
            continue  # the patterns themselves
        text = file.read_text()
        assert "DESIGN.md" not in text, file
        # the README's section that held the rules is gone: the rules page holds them
        assert "Provider contracts and the retry decision" not in " ".join(text.split()), file
        assert not re.search(r"rules? (of|in) README|README[^.]{0,30}\brules\b", text), file


def test_each_preset_and_its_source_is_on_the_contracts_page() -> None:
    page = (DOCS / "contracts.md").read_text()
    for name, contract in PRESETS.items():
        assert f"| `{name}` | {contract.source} |" in page, f"docs/contracts.md: preset {name}"
