"""No circle of imports between modules or folders, as a reader of the import lines
finds them (tests/test_layering.py holds the layers; this, the circles issue 44 named).

How imports are counted: every module of meshdl/, nodes/, edge/, sim/, server/ under its
`meshdl.*` name (pyproject's package-dir; `test_layering.modules`) is parsed with `ast`,
and an edge A -> B of the directed graph is an import statement of A, naming B or a
name of B, that is at *module level*: in the module's body, or inside an `if`, `try`,
`with` or class body there, since all of those run when A is imported. An import inside
a function body is not counted: it runs when the function is called, not when A is
imported, so it closes no circle of module loading (test_layering counts those too, for
the layers). An import under `if TYPE_CHECKING:` never runs, but it counts too
(`test_no_module_imports_another_that_imports_it_back_for_annotations`): a type checker
and a reader follow it, and it is how a circle is hidden rather than broken. So no
module may import, even for annotations only, a module that imports it: where a lower
module needs something of a higher one that imports it, it says what in a
`typing.Protocol` of its own (nodes/steps.py's `NodeForSteps`, nodes/besteffort.py's
`NodeForEffort`, sim/compiled.py's `InProcessMesh`), or the named type both use lives in
the lower module (sim/besteffort.py's `Receipt`).

A folder is the package a module is in (meshdl.sim.radio, meshdl.training, ...); the
modules at the root of meshdl/ (config, errors, limits, ...) are each their own unit,
since the root is the package of everything and holds the leaves all of them import.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_layering import _type_checking, cycles, modules


def _module_level(tree: ast.AST, annotations: bool):
    """The import statements that run when the module is imported (`annotations`: and
    those under `if TYPE_CHECKING:`), not those in function bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and _type_checking(node) and not annotations:
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def module_graph(annotations: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports at module level."""
    known = modules()

    def module_of(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        found = set()
        for node in _module_level(ast.parse(path.read_text(), str(path)), annotations):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from its package, up `level - 1`
                    here = name.split(".") if path.name == "__init__.py" else \
                        name.split(".")[:-1]
                    base = ".".join([*here[:len(here) - node.level + 1], *filter(None, [base])])
                targets = [f"{base}.{alias.name}" for alias in node.names]
            found |= {m for t in targets if t.split(".")[0] == "meshdl" and (m := module_of(t))}
        graph[name] = found - {name}
    return graph


def folder_of(module: str, known: dict[str, Path]) -> str:
    if known[module].name == "__init__.py":
        return module
    package = module.rpartition(".")[0]
    return module if package == "meshdl" else package


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    known = modules()
    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        unit = folder_of(module, known)
        folded.setdefault(unit, set()).update(
            f for t in targets if (f := folder_of(t, known)) != unit)
    return folded


def _why(graph: dict[str, set[str]], circle: list[str]) -> list[str]:
    """Each edge of a circle, for the failure message."""
    return [f"{a} -> {b}" for a in circle for b in sorted(graph[a]) if b in circle]


def test_no_module_imports_another_that_imports_it_back() -> None:
    graph = module_graph()
    assert [_why(graph, c) for c in cycles(graph)] == []


def test_no_folder_imports_another_that_imports_it_back() -> None:
    """config <-> compress, and training <-> sim <-> server <-> edge (the parameter
    server's and an edge's run loops over MQTT lived in server/ and edge/, and imported
    the training loop, which imports the server's machines and the simulator's cluster),
    were such circles. Annotations count: sim/cluster.py annotated its engines with
    the training loop's `Engine` (now its own `StepEngine`)."""
    known, graph = modules(), module_graph(annotations=True)
    folded = folder_graph(graph)
    found = []
    for circle in cycles(folded):
        found.append([f"{m} -> {t}" for m, targets in sorted(graph.items())
                      for t in sorted(targets) if folder_of(m, known) in circle and
                      folder_of(t, known) in circle and
                      folder_of(t, known) != folder_of(m, known)])
    assert found == []


def test_no_module_imports_another_that_imports_it_back_for_annotations() -> None:
    """Counting the imports under `if TYPE_CHECKING:` too. protocol/compact.py <->
    protocol/spec.py was such a circle, and so were (issue 44) the node machine, its
    steps, plan and best effort (the steps and the best effort annotated the machine,
    which imports them; the plan named the steps' runner); the timed mesh and the probe
    of best effort (its `Receipt`); and the compiled waves and the virtual mesh."""
    graph = module_graph(annotations=True)
    assert [_why(graph, c) for c in cycles(graph)] == []
