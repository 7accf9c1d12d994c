"""No import cycle anywhere in the package: every import statement grimp finds (at module
level, inside a function, under `TYPE_CHECKING`) counts, between any two of opledger's
modules. A cycle fails the test, named module by module.

import-linter's contracts keep the layers apart; this keeps every module below the ones
that import it, inside a layer too."""

from __future__ import annotations

import grimp
import pytest


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """One cycle per group of modules that import each other (each reaches every other
    through its imports), as the modules in import order, the first repeated at the end."""
    found: list[list[str]] = []
    placed: set[str] = set()
    for module in sorted(graph.modules):
        if module in placed:
            continue
        group = {module} | {
            other
            for other in graph.find_upstream_modules(module)
            if module in graph.find_upstream_modules(other)
        }
        placed |= group
        if len(group) > 1:
            found.append(_shortest_cycle(graph, module, group))
    return found


def _shortest_cycle(graph: grimp.ImportGraph, start: str, group: set[str]) -> list[str]:
    """A shortest cycle from `start` through modules of its group and back."""
    ways_back = [
        graph.find_shortest_chain(importer=imported, imported=start)
        for imported in sorted(graph.find_modules_directly_imported_by(start) & group)
    ]
    back = min((w for w in ways_back if w), key=len)
    return [start, *back]


def _graph(*edges: tuple[str, str]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for importer, imported in edges:
        graph.add_import(importer=importer, imported=imported)
    return graph


def test_the_finder_names_each_cycle_and_nothing_else() -> None:
    layered = _graph(("p.a", "p.b"), ("p.b", "p.c"), ("p.a", "p.c"))
    assert cycles(layered) == []
    two = _graph(("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"))
    assert cycles(two) == [["p.a", "p.b", "p.c", "p.a"]]
    apart = _graph(("p.a", "p.b"), ("p.b", "p.a"), ("p.x", "p.y"), ("p.y", "p.x"), ("p.a", "p.x"))
    assert sorted(cycles(apart)) == [["p.a", "p.b", "p.a"], ["p.x", "p.y", "p.x"]]
    # the way back is the shortest one, through whichever module the first imports
    shortcut = _graph(("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.a", "p.c"))
    assert cycles(shortcut) == [["p.a", "p.c", "p.a"]]


@pytest.fixture(scope="module")
def package() -> grimp.ImportGraph:
    return grimp.build_graph("opledger", cache_dir=None)


def test_opledger_has_no_import_cycle(package: grimp.ImportGraph) -> None:
    found = cycles(package)
    assert not found, "import cycles in opledger:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_graph_counts_imports_inside_functions(package: grimp.ImportGraph) -> None:
    """`register(app)` imports the tasks inside the function: grimp sees it (a cycle made of
    such imports would be found)."""
    assert package.direct_import_exists(
        importer="opledger.tasks.integrate", imported="opledger.tasks.app"
    )
