"""`python -m opledger.cli` is the `opledger` command."""

from opledger.cli.main import main

main()
