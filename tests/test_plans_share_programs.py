"""Plans of cells with the same neighbourhood hold one program and one set of
computation jobs (nodes/shared.py): read-only, so that no plan changes another's; and a
mesh of shared plans computes what one of unshared plans does."""

from __future__ import annotations

import numpy as np
import pytest

from meshdl import CNN, ModelConfig
from meshdl.nodes import shared
from meshdl.nodes.plan import NodePlan
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.sim.mesh import VirtualMesh


def _spec(rows: int = 7, cols: int = 8) -> MeshSpec:
    return MeshSpec(1, ModelConfig(rows=rows, cols=cols, kernel=3, filters=2, hidden=4,
                                   pool="global"))


def test_cells_of_one_neighbourhood_share_one_read_only_program_and_its_jobs() -> None:
    spec = _spec()
    plans = {(r, c): NodePlan(spec, (r, c)) for r in range(7) for c in range(8)}
    digests = {shared.content_digest(tuple(p.program)) for p in plans.values()}
    programs = {id(p.program) for p in plans.values()}
    assert len(programs) == len(digests) < len(plans) // 2  # one object per content
    same = [(p, q) for p in plans.values() for q in plans.values()
            if p is not q and p.program is q.program]
    assert same
    p, q = same[0]
    ops_p = [j.operation for j in p.jobs if j.operation is not None]
    ops_q = [j.operation for j in q.jobs if j.operation is not None]
    assert ops_p and all(x is y for x, y in zip(ops_p, ops_q, strict=True))
    for values in (*p.program, ops_p[0].at, ops_p[0].kept_at):
        assert not values.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            values[(0,) * values.ndim] = 1
    # Their waiters: one tuple object per distinct tuple of task numbers.
    assert all(shared.interned(tasks) is tasks for tasks in (*p.waiters.values(),
                                                             *q.waiters.values()))

def test_a_held_program_past_the_kept_number_is_a_plans_own(monkeypatch) -> None:
    monkeypatch.setattr(shared, "_HELD", shared.OrderedDict())
    monkeypatch.setattr(shared, "KEPT", 1)
    spec = _spec(4, 5)
    first = NodePlan(spec, (1, 1))
    NodePlan(spec, (0, 0))  # another content: the first goes
    again = NodePlan(spec, (1, 1))
    assert again.program is not first.program
    assert shared.content_digest(tuple(again.program)) == \
        shared.content_digest(tuple(first.program))
    assert NodePlan(spec, (1, 1)).program is again.program  # held again, once
    assert not first.program.lists.flags.writeable  # let go, still nobody's to change


def test_a_mesh_of_shared_plans_computes_what_unshared_plans_do(monkeypatch) -> None:
    config = ModelConfig(rows=5, cols=6, kernel=3, filters=2, hidden=4, pool="global")
    X = np.random.default_rng(1).normal(20.0, 3.0, (6, 5, 6)).astype(np.float32)
    labels = np.array([0, 1, 0, 1, 1, 0])

    def run() -> tuple[float, np.ndarray]:
        model = CNN(config, seed=0)
        model.set_normalization(20.0, 3.0)
        mesh = VirtualMesh(MeshSpec(1, config), {Split.TRAIN: X, Split.TEST: X}, model,
                           {Split.TRAIN: labels, Split.TEST: labels}, compiled=False)
        loss = mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4)).loss
        return loss, mesh.run_wave(Mode.INFER, Split.TEST, np.arange(6)).logits

    shared_loss, shared_logits = run()
    monkeypatch.setattr(shared, "KEPT", 0)  # every plan its own program and jobs
    monkeypatch.setattr(shared, "_HELD", shared.OrderedDict())
    own_loss, own_logits = run()
    assert shared_loss == own_loss
    assert np.array_equal(shared_logits, own_logits)


def test_a_grids_node_plans_hold_each_program_once_in_memory() -> None:
    """20 x 20, global head: 49 KB a plan before programs were held once, 26 KB after
    (tracemalloc, measured); the bound leaves room for Python's own allocation sizes."""
    import gc
    import tracemalloc

    spec = _spec(20, 20)
    spec.sends, spec.expects  # noqa: B018  (the spec's own tables, built before)
    NodePlan(spec, (5, 5))  # (the held programs of the inner cells, and the imports)
    gc.collect()
    tracemalloc.start()
    try:
        plans = [NodePlan(spec, (r, c)) for r in range(20) for c in range(20)]
        per_plan = tracemalloc.get_traced_memory()[0] / len(plans)
    finally:
        tracemalloc.stop()
    assert per_plan < 35_000, per_plan
