"""opledger: a durable operation ledger for external side effects caused by agents and workers."""

#: The one place the version is written: the package's metadata reads it (pyproject.toml,
#: `[tool.setuptools.dynamic]`), `opledger --version` prints it.
__version__ = "0.1.0"
