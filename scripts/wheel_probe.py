"""The import probe of `check_wheel.py`: run by the fresh virtualenv's Python (`-I`: no
PYTHONPATH, no user site, no working directory on sys.path), outside the checkout; it
imports every module of the installed package, runs its commands in this process, renders
the migrations offline, compiles the console's templates, and prints one JSON document.

Arguments: the modules not to import (JSON), where `opledger example NAME --to` writes,
and the example NAME.
"""

import contextlib
import importlib
import importlib.metadata
import io
import json
import pkgutil
import runpy
import sys
import sysconfig
import traceback
from pathlib import Path

import opledger

skipped = set(json.loads(sys.argv[1]))
written_to = sys.argv[2]  # where `opledger example NAME --to` writes
example = sys.argv[3]
report = {"prefix": sys.prefix, "purelib": sysconfig.get_paths()["purelib"]}

package_dir = Path(opledger.__file__).resolve().parent
report["file"] = str(Path(opledger.__file__).resolve())
report["version"] = opledger.__version__
report["metadata_version"] = importlib.metadata.version("opledger")

failed = {}


def failure(name):
    failed[name] = traceback.format_exc(limit=-3)


imported = []
for info in pkgutil.walk_packages(opledger.__path__, "opledger.", onerror=failure):
    if info.name in skipped:
        continue
    try:
        module = importlib.import_module(info.name)
    except BaseException:
        failure(info.name)
        continue
    imported.append((info.name, str(Path(module.__file__ or "").resolve())))
report["imported"] = imported
report["failed"] = failed


def cli(argv, call):
    # a command run in this process: its exit code and what it printed
    out, saved, code = io.StringIO(), sys.argv, 0
    sys.argv = list(argv)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            call()
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        return {"error": traceback.format_exc(limit=-3)}
    finally:
        sys.argv = saved
    return {"code": code, "output": out.getvalue()}


scripts = importlib.metadata.entry_points(group="console_scripts", name="opledger")
report["script"] = [script.value for script in scripts]
if len(scripts) == 1:
    main = next(iter(scripts)).load()
    report["check_help"] = cli(["opledger", "check", "--help"], main)
    # the examples as a pip user reaches them: listed, written out, not written over
    report["example_list"] = cli(["opledger", "example"], main)
    write = ["opledger", "example", example, "--to", written_to]
    report["example_write"] = cli(write, main)
    report["example_write_again"] = cli(write, main)
# `python -m opledger.examples.NAME` is runpy running the module as __main__
report["example_help"] = cli(
    [example, "--help"],
    lambda: runpy.run_module(f"opledger.examples.{example}", run_name="__main__", alter_sys=True),
)
# `python -m opledger.cli` is runpy running the package's __main__
report["module_version"] = cli(
    [sys.executable, "--version"],
    lambda: runpy.run_module("opledger.cli", run_name="__main__", alter_sys=True),
)

report["files"] = sorted(
    str(p.relative_to(package_dir))
    for p in package_dir.rglob("*")
    if p.is_file() and "__pycache__" not in p.parts
)

try:
    from alembic import command
    from alembic.script import ScriptDirectory

    from opledger.ledger.migrate import alembic_config

    config = alembic_config("postgresql://nobody@127.0.0.1:1/nowhere", "opledger")
    scripts = ScriptDirectory.from_config(config)
    config.output_buffer = io.StringIO()
    command.upgrade(config, "head", sql=True)
    sql = config.output_buffer.getvalue()
    report["migrations"] = {
        "location": str(Path(scripts.dir).resolve()),
        "heads": list(scripts.get_heads()),
        "revisions": sum(1 for _ in scripts.walk_revisions()),
        "create_tables": sql.count("CREATE TABLE"),
    }
except BaseException:
    report["migrations"] = {"error": traceback.format_exc(limit=-3)}

try:
    from opledger.console.web import environment

    env = environment()
    names = env.list_templates()
    for name in names:
        env.get_template(name)
    report["templates"] = names
except BaseException:
    report["templates"] = {"error": traceback.format_exc(limit=-3)}

print(json.dumps(report))
