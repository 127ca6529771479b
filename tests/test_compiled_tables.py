"""The compiled loop's tables are checked before it runs (nodes/compiled.py, `validate`):
the loop reads without bounds checks, so every number of the tables it indexes with is
held to the size of what it indexes, and tables that fail are refused in one line. The
fields to check are declared (`INDEXES`, `VALUES`), so a field added to `Tables` without
saying what it is fails here."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import typing
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from meshdl import CNN, ModelConfig
from meshdl.nodes.compiled import (
    INDEXES,
    NONE,
    VALUES,
    Tables,
    TablesError,
    UnknownStep,
    tabulate,
    validate,
)
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.sim.mesh import VirtualMesh

BIG = 10**6  # past anything a small mesh's tables count


def _mesh(pool, compiled: bool = True) -> VirtualMesh:
    """A small mesh pooling by `pool`; "position": globally, with a position bias."""
    table = pool == "position"
    config = ModelConfig(rows=4, cols=5, kernel=3, filters=2, conv_layers=2,
                         pool="global" if table else pool, hidden=4, position_bias=table)
    X = np.random.default_rng(0).normal(20.0, 3.0, (6, 4, 5)).astype(np.float32)
    model = CNN(config, seed=0)
    model.set_normalization(20.0, 3.0)
    return VirtualMesh(MeshSpec(1, config), {Split.TRAIN: X, Split.TEST: X}, model,
                       {Split.TRAIN: np.zeros(6, np.int64), Split.TEST: np.zeros(6, np.int64)},
                       compiled=compiled)


@cache
def _tables(pool) -> Tables:
    mesh = _mesh(pool)
    return tabulate(mesh.spec, [mesh.nodes[cell] for cell in mesh.spec.topology.cells()]).tables


def _live(tables: Tables, field: str) -> tuple[int, ...] | None:
    """A position of `field` the loop reads: a non-empty range, a number not NONE."""
    values = np.asarray(getattr(tables, field))
    if INDEXES[field].listed or INDEXES[field].span:
        found = np.argwhere(values[..., 1] > values[..., 0])
    else:
        found = np.argwhere(values != NONE) if values.ndim else np.zeros((1, 0), int)
    return tuple(int(i) for i in found[-1]) if len(found) else None  # (w_off[0]: unused)


def _tampered(field: str, via: str | None, value: int) -> tuple[Tables, str]:
    """Tables of a mesh with one number of `field` set to `value` (of `lists`: the first
    number the range field `via` lists), and what the refusal must name."""
    # (windowed pooling has block lists, global children's; a position bias its table)
    for pool in (2, "global", "position"):
        tables = _tables(pool)
        at = _live(tables, via or field)
        if at is not None:
            break
    else:
        raise AssertionError(f"no mesh here uses Tables.{via or field}")
    if field == "lists":
        start = int(getattr(tables, via)[at][0])
        lists = tables.lists.copy()
        lists[start] = value
        return tables._replace(lists=lists), f"Tables.lists[{start}]"
    values = np.array(getattr(tables, field))
    if INDEXES[field].listed or INDEXES[field].span:
        at = (*at, 0 if value < 0 else 1)  # a start below 0, an end past the list
    if values.ndim:
        values[at] = value
        return tables._replace(**{field: values}), f"Tables.{field}["
    return tables._replace(**{field: value}), f"Tables.{field}"


CASES = [(field, None) for field in INDEXES if field != "lists"] + \
    [("lists", field) for field, index in INDEXES.items() if index.listed]


def test_every_integer_field_of_the_tables_is_declared_an_index_or_a_value() -> None:
    tables = _tables(2)
    integers = {name for name in Tables._fields
                if np.issubdtype(np.asarray(getattr(tables, name)).dtype, np.integer)}
    assert integers - set(INDEXES) - VALUES == set()  # a new field says what it is
    assert set(INDEXES) & VALUES == set()
    assert (set(INDEXES) | VALUES) - integers == set()  # (no stale name)
    assert set(typing.get_type_hints(Tables)) == set(Tables._fields)


@pytest.mark.parametrize("value", [BIG, -2], ids=["past", "below"])
@pytest.mark.parametrize(("field", "via"), CASES,
                         ids=[f if v is None else f"lists-of-{v}" for f, v in CASES])
def test_a_tampered_index_is_refused_in_one_line(field, via, value) -> None:
    tables, named = _tampered(field, via, value)
    with pytest.raises(TablesError) as refused:
        validate(tables)
    line = str(refused.value)
    assert "\n" not in line and named in line
    if via is not None:
        assert f"Tables.{via}[" in line  # the list that holds the number


def test_the_tables_of_a_mesh_pass() -> None:
    for pool in (1, 2, "global", "position"):
        validate(_tables(pool))


def test_a_task_of_an_unknown_step_is_refused_and_stops_the_loop() -> None:
    """Checked tables name no unknown step; tables changed after the check make the
    loop raise instead of finishing the wave without the task's arithmetic."""
    tables = _tables(2)
    steps = tables.task_step.copy()
    steps[int(np.flatnonzero(steps > 0)[0])] = 99
    with pytest.raises(TablesError, match=r"Tables\.task_step\["):
        validate(tables._replace(task_step=steps))
    mesh = _mesh(2)
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(3))  # (builds the tables)
    waves = mesh._compiled
    waves.tables = waves.tables._replace(task_step=np.where(
        waves.tables.task_step > 0, 99, waves.tables.task_step))
    with pytest.raises(UnknownStep, match="unknown step code"):
        mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(3))


# One slot a conv writes (its own activation) or reads (its input window) out of range:
# the loop (no bounds checks) read and wrote outside its arrays and the process died
# (SIGSEGV) before `validate`.
CRASH = textwrap.dedent("""
    import sys
    import numpy as np
    from meshdl.errors import MeshdlError
    from meshdl.nodes import compiled
    from meshdl.protocol.spec import Mode, Split
    sys.path.insert(0, {tests!r})
    from test_compiled_tables import _mesh

    build = compiled._Builder.tables
    def tampered(self):
        tables = build(self)
        conv = int(np.flatnonzero(tables.task_step == compiled.CONV)[0])
        operand = 2 if {field!r} == "own_slot" else 0  # its output, or its input window
        lists = tables.lists.copy(); lists[tables.task_args[conv, operand, 0]] = 10**9
        return tables._replace(lists=lists)
    compiled._Builder.tables = tampered
    mesh = _mesh(2)
    try:
        mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(3))
    except MeshdlError as error:
        print(error)
        sys.exit(1)
""")


@pytest.mark.parametrize("field", ["own_slot", "window_slot"])
def test_a_mesh_whose_tables_read_out_of_range_refuses_them_and_does_not_crash(field) -> None:
    script = CRASH.format(tests=str(Path(__file__).parent), field=field)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1, (run.returncode, run.stderr[-2000:])
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compiled tables refused:")
