"""Rules the test suite keeps about itself.

CI runs on a loaded 2-core machine, where a wall-clock bound that holds alone fails
(issue 29: "every process exits within 2.0 s of SIGTERM" failed at 2.43 s there). So no
test bounds a wall-clock duration from above; speed is measured by `meshdl bench`. A
bound on how long a test may wait for something (a hang guard: `time.monotonic() <
deadline`) is not a duration claim and is allowed.

The check reads every test module with `ast` and flags an assertion that bounds from
above, by a positive number, a wall-clock quantity: a key or name such as `wall_s` or
`sigterm_s` (what our records call wall-clock seconds), or a name assigned from
`time.monotonic()`, `time.perf_counter()` or `time.time()` arithmetic in the same test.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# What run records, benchmarks and the hostile bench call wall-clock seconds.
WALL_CLOCK_KEYS = frozenset({"wall_s", "sigterm_s", "waves_wall_s", "wall_seconds"})
CLOCKS = frozenset({"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns"})


def _is_clock_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr in CLOCKS and isinstance(node.func.value, ast.Name) and \
        node.func.value.id in ("time", "_time")


def _clock_names(function: ast.AST) -> set[str]:
    """Names a test assigns from a clock difference (`elapsed = time.monotonic() - t0`)."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp) and \
                any(_is_clock_call(n) for n in ast.walk(node.value)):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _wall_clock(node: ast.AST, clock_names: set[str]) -> bool:
    """Does this expression read a wall-clock quantity?"""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) and \
                sub.slice.value in WALL_CLOCK_KEYS:
            return True
        if isinstance(sub, (ast.Name, ast.Attribute)):
            name = sub.id if isinstance(sub, ast.Name) else sub.attr
            if name in WALL_CLOCK_KEYS or name in clock_names:
                return True
        if isinstance(sub, ast.BinOp) and any(_is_clock_call(n) for n in ast.walk(sub)):
            return True
    return False


def _upper_bounds(test: ast.Assert) -> list[tuple[ast.AST, ast.AST]]:
    """(quantity, bound) of each `quantity < bound`-like comparison in an assertion
    whose bound is a positive number."""
    out = []
    for node in ast.walk(test.test):
        if not isinstance(node, ast.Compare):
            continue
        left = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, (ast.Lt, ast.LtE)):
                out.append((left, right))
            elif isinstance(op, (ast.Gt, ast.GtE)):
                out.append((right, left))
            left = right
    return [(q, b) for q, b in out if isinstance(b, ast.Constant) and
            isinstance(b.value, (int, float)) and not isinstance(b.value, bool) and b.value > 0]


def wall_clock_bounds(source: str, filename: str = "<test>") -> list[str]:
    """The assertions of `source` that bound a wall-clock quantity from above."""
    tree = ast.parse(source, filename)
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        clock_names = _clock_names(function)
        for node in ast.walk(function):
            if isinstance(node, ast.Assert) and any(
                    _wall_clock(quantity, clock_names) or
                    _is_comprehension_over_wall_clock(node.test, clock_names)
                    for quantity, _ in _upper_bounds(node)):
                found.append(f"{filename}:{node.lineno}: {ast.unparse(node.test)[:100]}")
    return found


def _is_comprehension_over_wall_clock(test: ast.AST, clock_names: set[str]) -> bool:
    """`all(s < 2.0 for s in run["sigterm_s"].values())`: the bounded name is drawn
    from a wall-clock record."""
    return any(isinstance(sub, (ast.GeneratorExp, ast.ListComp)) and
               any(_wall_clock(gen.iter, clock_names) for gen in sub.generators)
               for sub in ast.walk(test))


def test_no_test_bounds_a_wall_clock_duration() -> None:
    found = [hit for path in sorted(TESTS.glob("test_*.py"))
             for hit in wall_clock_bounds(path.read_text(), path.name)]
    assert not found, "wall-clock bounds (measure them in `meshdl bench`):\n" + \
        "\n".join(found)


def test_the_rule_finds_the_bounds_it_is_for_and_spares_hang_guards() -> None:
    flagged = '''
def test_a(run):
    assert all(s < 2.0 for s in run["sigterm_s"].values())
def test_b(metrics):
    assert metrics["wall_s"] <= 30
def test_c():
    t0 = time.monotonic()
    work()
    elapsed = time.monotonic() - t0
    assert elapsed < 1.5
def test_d():
    t0 = time.perf_counter()
    assert time.perf_counter() - t0 < 0.1
'''
    spared = '''
def test_e(metrics, deadline):
    assert metrics["wall_s"] > 0
    assert time.monotonic() < deadline
    assert metrics["makespan_s"] < 10.0
    assert 0 < metrics["wall_s"]
'''
    assert len(wall_clock_bounds(flagged)) == 4, wall_clock_bounds(flagged)
    assert wall_clock_bounds(spared) == []
