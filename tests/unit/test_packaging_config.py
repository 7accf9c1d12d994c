"""pyproject.toml names every package by name (`[tool.setuptools] packages`: the examples
are `opledger.examples`, mapped from examples/, which `packages.find` cannot do), so a
new directory under opledger/ must be named there too, or the wheel leaves it out. This
says so at once, by name; tests/system/test_wheel.py finds the same by installing the
wheel."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _setuptools() -> dict[str, object]:
    config: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]
    return config


def _directories(top: Path, name: str) -> set[str]:
    """`name` and its subpackages as `packages.find` (namespaces too) finds them: every
    directory with a file in it, caches left out."""
    found = set()
    for directory in [top, *(p for p in top.rglob("*") if p.is_dir())]:
        parts = directory.relative_to(top).parts
        if any(part == "__pycache__" or part.startswith(".") for part in parts):
            continue
        if any(p.is_file() for p in directory.iterdir()):
            found.add(".".join((name, *parts)))
    return found


def test_every_directory_of_the_package_is_a_listed_package() -> None:
    config = _setuptools()
    listed = set(config["packages"])  # type: ignore[call-overload]
    package_dir: dict[str, str] = config["package-dir"]  # type: ignore[assignment]
    assert package_dir == {"opledger.examples": "examples"}
    expected = _directories(ROOT / "opledger", "opledger") | {"opledger.examples"}
    assert listed == expected, (
        f"add to [tool.setuptools] packages: {sorted(expected - listed)}; "
        f"remove: {sorted(listed - expected)}"
    )


def test_every_file_of_examples_is_package_data() -> None:
    patterns: list[str] = _setuptools()["package-data"]["opledger.examples"]  # type: ignore[index]
    files = [p.name for p in (ROOT / "examples").iterdir() if p.is_file()]
    assert files
    unshipped = [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)]
    assert unshipped == []
    assert not any(p.is_dir() for p in (ROOT / "examples").iterdir() if p.name != "__pycache__"), (
        "examples/ has a subdirectory: its files are not shipped (package-data is '*')"
    )
