"""What the compiled dispatch (sim/compiled.py) runs, and what it leaves the node
machines: it says what it supports (an allow-list: anything else goes through the
machines), asks nodes and meshes through their public methods, and moves each node's
lifecycle once per wave, so that a node's wave, phase and counts are the same after
either dispatch."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np

from meshdl import CNN, ModelConfig
from meshdl.protocol.lifecycle import NodePhase
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.sim.compiled import unsupported
from meshdl.sim.mesh import VirtualMesh

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class _NewFeatureSpec(MeshSpec):
    """A mesh spec with a field the compiled dispatch has never heard of, as a feature
    added later would bring."""

    novelty: int = 0


def _mesh(spec: MeshSpec, compiled: bool = True) -> VirtualMesh:
    config = spec.model
    X = np.random.default_rng(0).normal(20.0, 3.0, (6, config.rows, config.cols))
    X = X.astype(np.float32)
    model = CNN(config, seed=0)
    model.set_normalization(20.0, 3.0)
    labels = np.zeros(6, np.int64)
    return VirtualMesh(spec, {Split.TRAIN: X, Split.TEST: X}, model,
                       {Split.TRAIN: labels, Split.TEST: labels}, compiled=compiled)


CONFIG = ModelConfig(rows=3, cols=4, kernel=3, filters=2, hidden=4)


def test_a_spec_field_the_dispatch_does_not_know_sends_waves_to_the_machines() -> None:
    """Only what it states it supports runs compiled: a new field at its default
    changes nothing, at any other value the machines run the wave."""
    assert unsupported(_NewFeatureSpec(1, CONFIG)) == []
    assert unsupported(_NewFeatureSpec(1, CONFIG, novelty=1)) == ["novelty"]
    assert unsupported(MeshSpec(1, CONFIG, auth=True, compress="topk:0.1")) == \
        ["auth", "compress"]
    for novelty, compiled in ((0, True), (1, False)):
        mesh = _mesh(_NewFeatureSpec(1, CONFIG, novelty=novelty))
        mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(3))
        assert (mesh._compiled is not None) == compiled


def _after_waves(compiled: bool) -> VirtualMesh:
    mesh = _mesh(MeshSpec(1, CONFIG), compiled=compiled)
    mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(3))
    mesh.run_wave(Mode.INFER, Split.TEST, np.arange(2))
    assert (mesh._compiled is not None) == compiled
    return mesh


def test_after_a_compiled_wave_each_node_is_where_the_machines_leave_it() -> None:
    """Its current wave (step, edge session, mode), DONE, and, once the mesh settles
    (before its counts are read, or the machines run), the messages it took."""
    meshes = {compiled: _after_waves(compiled) for compiled in (True, False)}
    meshes[True].settle()
    for cell, node in meshes[True].nodes.items():
        machine = meshes[False].nodes[cell]
        for n in (node, machine):
            assert n.wave is not None and n.wave.phase is NodePhase.DONE
        assert (node.wave.step, node.wave.mode, node.wave.batch) == \
            (machine.wave.step, machine.wave.mode, machine.wave.batch)
        assert node.wave.session == meshes[True].edge.session
        assert node.stats["accepted"] == machine.stats["accepted"] > 0
        assert node.flops == machine.flops > 0  # the operations it ran, as it counts them
        assert list(node.sessions) == [meshes[True].edge.session]


def test_a_node_counts_the_operations_of_compiled_waves_as_of_its_own() -> None:
    """Windowed and global pooling, three layers, a training wave with failout and an
    inference wave: each node's flops after the compiled waves (settled) are those its
    machine counts running them."""
    for config in (CONFIG, CONFIG.model_copy(update={"pool": "global", "alive": True}),
                   ModelConfig(rows=5, cols=6, kernel=3, filters=2, hidden=4,
                               conv_layers=3)):
        flops = {}
        for compiled in (True, False):
            mesh = _mesh(MeshSpec(1, config), compiled=compiled)
            mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(3), failout=np.array([1]))
            mesh.run_wave(Mode.INFER, Split.TEST, np.arange(5))
            mesh.run_wave(Mode.TRAIN, Split.TRAIN, np.arange(4))
            mesh.settle()
            assert (mesh._compiled is not None) == compiled
            flops[compiled] = {cell: node.flops for cell, node in mesh.nodes.items()}
        assert flops[True] == flops[False]


def test_the_compiled_dispatch_reaches_into_no_other_objects_private_members() -> None:
    """sim/compiled.py asks nodes and the mesh through their public methods (it once
    read `node._params_shaped`, `_valid_batch`, `mesh._finish_wave`, `mesh._timing`)."""
    tree = ast.parse((ROOT / "sim" / "compiled.py").read_text())
    reached = sorted({f"{node.value.id}.{node.attr}" for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and node.attr.startswith("_")
                      and not node.attr.startswith("__") and isinstance(node.value, ast.Name)
                      and node.value.id not in ("self", "cls")})
    assert reached == []
