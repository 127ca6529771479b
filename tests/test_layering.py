"""Imports only run down the layers, and no module imports itself back round a cycle.

Every module of the package (meshdl/, and nodes/, edge/, server/, sim/ as `meshdl.nodes`,
...) is parsed with `ast`; every import counts, at module level and inside functions,
except those under `if TYPE_CHECKING:` (annotations only: they never run). `LAYERS` is
the one table of the layers, lowest first; a module belongs to the layer of the longest
name in it that is the module's own or one of its packages'.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Where each top-level package's files live (pyproject.toml's package-dir).
SOURCES = {"meshdl": "meshdl", "meshdl.nodes": "nodes", "meshdl.edge": "edge",
           "meshdl.server": "server", "meshdl.sim": "sim"}

# Lowest first: a module may import its own layer and the layers below, never above.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Leaves anyone may import: errors, configuration, and what configuration parses
    # (message size limits, how meshes keep step, the `--compress` grammar); BLAS held
    # to one thread.
    ("leaves", ("meshdl.errors", "meshdl.config", "meshdl.limits", "meshdl.sync",
                "meshdl.compress_grammar", "meshdl.blas")),
    # Numba kernels: the CNN's and its int8 quantization's, the compressors', a node's own cell's.
    ("kernels", ("meshdl.model.kernels", "meshdl.model.quantize", "meshdl.compress.kernels",
                 "meshdl.nodes.compute")),
    # The model, the data it learns from, and the pages and plots that show results.
    ("model", ("meshdl", "meshdl.model", "meshdl.data", "meshdl.report")),
    ("compress", ("meshdl.compress",)),
    # What goes over the mesh: messages, payloads, topology, the sends table, deadlines.
    ("protocol", ("meshdl.protocol",)),
    # How messages travel: a real broker, or the simulated radio.
    ("transport", ("meshdl.mqtt", "meshdl.sim.radio")),
    # What runs a wave: the node, the edge and the parameter server as machines, the
    # processes that serve them over MQTT, the simulator's drivers and their faults.
    ("engines", ("meshdl.nodes", "meshdl.edge", "meshdl.server", "meshdl.sim",
                 "meshdl.sim.faults")),
    # What runs a training run on the engines: the training loop (one mesh, several in
    # process), and the run loops of the parameter server's and an edge's processes when
    # several meshes train over MQTT (training/ps_run.py, training/edge_run.py).
    ("runs", ("meshdl.training",)),
    # What a researcher runs on the engines: studies, benchmarks, experiments.
    ("studies", ("meshdl.sim.studies", "meshdl.bench", "meshdl.experiments")),
    ("cli", ("meshdl.cli", "meshdl.__main__")),
)


def modules() -> dict[str, Path]:
    """Every module's dotted name -> its file."""
    found = {}
    for package, folder in SOURCES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = (package, *path.relative_to(ROOT / folder).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported_names(tree: ast.AST):
    """Every Import and ImportFrom node, skipping `if TYPE_CHECKING:` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules `name` imports."""

    def module_of(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    out = set()
    for node in _imported_names(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                here = here[:len(here) - node.level + 1]
                base = ".".join([*here, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            if target.split(".")[0] == "meshdl" and (module := module_of(target)):
                out.add(module)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def layer_of(module: str) -> tuple[int, str]:
    """(the layer's rank, the table's entry that places `module`)."""
    best = (-1, "")
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and \
                    len(prefix) > len(best[1]):
                best = (rank, prefix)
    return best


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer_of(m)[0] < 0] == []


def test_no_import_cycle_between_modules():
    assert cycles(graph()) == []


def test_no_import_cycle_between_packages():
    """Folded onto the table's entries (a folder, or a module the table names), the
    imports still form no cycle: no two folders lean on each other."""
    folded: dict[str, set[str]] = {}
    for module, targets in graph().items():
        unit = layer_of(module)[1]
        folded.setdefault(unit, set()).update(
            layer_of(t)[1] for t in targets if layer_of(t)[1] != unit)
    assert cycles(folded) == []


def test_imports_only_run_down():
    upward = sorted(
        f"{module} ({LAYERS[layer_of(module)[0]][0]}) imports {target} "
        f"({LAYERS[layer_of(target)[0]][0]})"
        for module, targets in graph().items() for target in targets
        if layer_of(target)[0] > layer_of(module)[0])
    assert upward == []


def test_package_inits_import_nothing_but_the_root():
    """A folder's `__init__` only says what the folder is for: importing one module of
    it loads no other (the root `meshdl` re-exports the model and its configuration)."""
    known = modules()
    heavy = {name: sorted(imports(name, path, known)) for name, path in known.items()
             if path.name == "__init__.py" and name not in ("meshdl", "meshdl.cli")}
    assert {name: found for name, found in heavy.items() if found} == {}
