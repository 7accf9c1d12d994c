"""opledger's examples, shipped with the package as `opledger.examples` (the repository's
examples/ directory): run one with `python -m opledger.examples.NAME`, list them or copy
one out with `opledger example [NAME] [--to DIR]`. Nothing of opledger imports them."""
