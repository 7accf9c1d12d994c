"""The image builds the package from what it copies: the Dockerfile copies every file the
package's metadata names (its readme, its license files), so the image's install carries
the license and setuptools finds what pyproject.toml points at."""

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
