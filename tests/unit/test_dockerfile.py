"""The image builds the package from what it copies: the Dockerfile copies every file the
package's metadata names (its readme, its license files) and every directory a package is
built from (`opledger`, and `examples`, which ships as `opledger.examples`), so the image's
install carries the license and setuptools finds what pyproject.toml points at."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _copied() -> set[str]:
    names: set[str] = set()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"]:
            names.update(w.rstrip("/") for w in words[1:-1] if not w.startswith("--"))
    return names


def test_the_image_copies_every_file_the_metadata_names() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = {project["readme"], *project["license-files"]}
    assert named <= _copied(), named - _copied()
    assert "opledger" in _copied()
    assert all((ROOT / name).is_file() for name in named)


def test_the_image_copies_every_directory_a_package_is_built_from() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {d.split("/")[0] for d in setuptools.get("package-dir", {}).values() if d}
    assert "examples" in dirs  # the examples ship with the package
    assert dirs <= _copied(), dirs - _copied()
