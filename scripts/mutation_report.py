"""Kill rate per module from mutmut's results (`make mutate` prints it after the run).

mutmut 3 writes one `mutants/<path>.meta` per mutated file, mapping each mutant to the exit
code of the tests run against it. This reads them, counts the mutants by status (mutmut's
own names: killed, survived, no tests, timeout, ...) and prints, per module and for the
adapters' error mapping on its own, the kill rate mutmut's badge uses:
(killed + timeout) / (all - skipped). The survivors are listed by name, for `mutmut show`.
The same report is written to mutants/mutation-report.txt.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code

MUTANTS = Path("mutants")
MODULES = (
    "opledger/ledger/decide.py",
    "opledger/ledger/evidence.py",
    "opledger/ledger/risk.py",
    "opledger/ledger/canonical.py",
    "opledger/adapters/base.py",
)
#: the part of base.py that maps provider answers and client errors to outcomes
ERROR_MAPPING = (
    "outcome_for_http_error",
    "outcome_for_http_status",
    "error_code",
    "_message",
    "reuses_connections",
    "ErrorCodes",
)
COLUMNS = ("killed", "timeout", "survived", "no tests", "other")


def function_of(mutant: str) -> str:
    """`opledger.adapters.base.x_error_code__mutmut_3` -> `error_code`;
    `...xǁWindowedTransportǁclose__mutmut_1` -> `WindowedTransport.close`."""
    mangled = mutant.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]
    if mangled.startswith("xǁ"):
        return ".".join(part for part in mangled[2:].split("ǁ") if part)
    return mangled.removeprefix("x_")


def tally(results: dict[str, int | None]) -> tuple[Counter[str], list[str]]:
    counts: Counter[str] = Counter()
    survivors = []
    for mutant, exit_code in sorted(results.items()):
        status = status_by_exit_code[exit_code]
        counts[status if status in COLUMNS or status == "skipped" else "other"] += 1
        if status != "killed" and status != "timeout":
            survivors.append(f"{mutant}: {status}")
    return counts, survivors


def rate(counts: Counter[str]) -> float:
    tested = sum(counts.values()) - counts["skipped"]
    return 100.0 * (counts["killed"] + counts["timeout"]) / tested if tested else 0.0


def main() -> int:
    rows: list[tuple[str, Counter[str]]] = []
    survivors: list[str] = []
    for module in MODULES:
        meta = MUTANTS / f"{module}.meta"
        if not meta.exists():
            print(f"no results for {module}: run `make mutate` first", file=sys.stderr)
            return 1
        results: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        counts, left = tally(results)
        rows.append((module, counts))
        survivors += left
        if module.endswith("adapters/base.py"):
            mapping = {m: c for m, c in results.items() if function_of(m) in ERROR_MAPPING}
            rows.append(("  of which the error mapping", tally(mapping)[0]))

    width = max(len(name) for name, _ in rows)
    lines = [
        f"{'module':<{width}}  {'mutants':>7}  "
        + "  ".join(f"{c:>8}" for c in COLUMNS)
        + f"  {'kill rate':>9}"
    ]
    for name, counts in rows:
        lines.append(
            f"{name:<{width}}  {sum(counts.values()):>7}  "
            + "  ".join(f"{counts[c]:>8}" for c in COLUMNS)
            + f"  {rate(counts):>8.1f}%"
        )
    lines += ["", f"{len(survivors)} mutants not killed (`mutmut show NAME` shows one):"]
    lines += [f"  {s}" for s in survivors]
    report = "\n".join(lines) + "\n"
    (MUTANTS / "mutation-report.txt").write_text(report)
    print(report, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
