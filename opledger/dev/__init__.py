"""Development tooling: the sandbox provider, chaos runs, the demo, the benchmark and the
embedded Postgres/Redis finder.

Nothing at runtime (the ledger, the adapters, the tasks, the settings) imports this
package (an import-linter contract checks it); its servers need the `dev` extra.
"""
