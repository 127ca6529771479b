"""`meshdl simulate`'s engine and report: training and inference waves under simulated
time, and what they cost in seconds, frames and joules (sim.json, trace.jsonl,
energy.png).

`SimEngine` is the training loop's engine (as `MeshEngine` is for the virtual mesh),
so `meshdl simulate train` runs exactly `meshdl train`'s loop with one more clock.
"""

from __future__ import annotations

import gc
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from meshdl.data.augment import as_read_by, mirrors_of
from meshdl.data.datasets import Dataset
from meshdl.edge.agent import WaveEngine, WaveResult
from meshdl.limits import MAX_MESSAGE_BYTES
from meshdl.model.cnn import CNN
from meshdl.protocol.accounting import class_name
from meshdl.protocol.messages import EDGE, Kind
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.protocol.topics import name_of
from meshdl.protocol.topology import Cell
from meshdl.report.maps import energy_figure
from meshdl.report.plots import save_png
from meshdl.sim.besteffort import BestEffort
from meshdl.sim.cluster import WaveShape
from meshdl.sim.faults.stragglers import Stragglers
from meshdl.sim.mesh import by_split, cyclic_gc_paused
from meshdl.sim.radio import energy
from meshdl.sim.radio.device import DeviceProfile
from meshdl.sim.radio.loss import FrameLoss
from meshdl.sim.radio.media import BROKER, MediumName
from meshdl.sim.radio.profiles import RadioProfile
from meshdl.sim.radio.trace import Sent
from meshdl.sim.timed import TimedMesh, Usage


class SimEngine(WaveEngine):
    """The training loop's engine, running every batch as a wave in simulated time."""

    def __init__(self, data: Dataset, radio: RadioProfile, medium: MediumName,
                 device: DeviceProfile, edge_device: DeviceProfile, seed: int = 0,
                 trace: bool = False, edge_at: Cell = (0, 0), mesh_id: int = 1,
                 params_via: str | None = None,
                 max_message_bytes: int = MAX_MESSAGE_BYTES,
                 loss: FrameLoss | None = None,
                 stragglers: Stragglers | None = None,
                 best_effort: BestEffort | None = None,
                 known_dead: frozenset[Cell] = frozenset(),
                 failing: frozenset[Cell] = frozenset(),
                 attach: tuple[Cell, ...] = (), compress: str = "none",
                 activations: str = "float32", paired_backoffs: bool = False,
                 lasting: bool = False) -> None:
        """`best_effort`: lost messages stay lost and parties give up at deadlines
        (None: reliable mode, every message arrives). `known_dead`: cells that never come
        up, and that the edge knows of; `failing`: the same, for the protocol to find
        (best effort; sim/faults/dead.py). `attach`: other cells the edge may attach to.
        `lasting`: the engine's mesh lives as long as the process (a one-shot command
        with one model): once built, it is frozen out of the cyclic collector's scans."""
        self.data, self.compress, self.activations = data, compress, activations
        # Each radio its own backoff stream (`Medium.pair_backoffs`): for runs compared
        # plan against plan.
        self.paired_backoffs = paired_backoffs
        self.loss, self.stragglers, self.best_effort = loss, stragglers, best_effort
        self.known_dead, self.failing, self.attach = known_dead, failing, attach
        self.train_samples = len(data.y_train)
        self.radio, self.medium, self.device = radio, medium, device
        self.edge_device, self.seed, self.trace = edge_device, seed, trace
        self.edge_at, self.mesh_id = edge_at, mesh_id
        # A radio mesh floods parameters down the tree; a broker fans them out.
        self.params_via = params_via or ("tree" if medium == "shared" else "broadcast")
        self.max_message_bytes = max_message_bytes
        self.mesh: TimedMesh | None = None
        self._threadpools = ThreadpoolController()
        self.lasting = lasting

    def mesh_for(self, model: CNN) -> TimedMesh:
        """The mesh whose edge holds `model`: the last one, or a new one when the model
        is another."""
        if self.mesh is None or self.mesh.edge.model is not model:
            with cyclic_gc_paused():  # see `_new_mesh`
                mesh = self._new_mesh(model)
                if self.lasting:  # else each later full collection would scan it again
                    gc.freeze()
                return mesh
        return self.mesh

    def _new_mesh(self, model: CNN) -> TimedMesh:
        """A mesh whose edge holds `model`. Its plans are a great many long-lived
        objects made at once: the cyclic collector, left on, would scan them again and
        again as they grow (half the time of building a 100 x 100 mesh's node plans,
        measured); their few cycles (a node and its best effort) live as long as the
        mesh anyway."""
        spec = MeshSpec(self.mesh_id, model.config, self.edge_at, self.params_via,
                        self.max_message_bytes, dead=self.known_dead,
                        compress=self.compress, activations=self.activations)
        # Each node holds its cell's values as the model reads them (the alive mask).
        readings, labels = by_split(as_read_by(self.data, model.config))
        self.mesh = TimedMesh(spec, readings, model, labels, self.radio, self.medium,
                              self.device, self.edge_device, self.seed, self.trace,
                              loss=self.loss, stragglers=self.stragglers,
                              best_effort=self.best_effort, attach=self.attach,
                              compiled=not (self.paired_backoffs or self.failing),
                              originals=mirrors_of(self.data))
        if self.paired_backoffs:
            self.mesh.medium.pair_backoffs()
        for cell in sorted(self.failing):
            self.mesh.kill(cell)
        return self.mesh

    def spec_for(self, model: CNN) -> MeshSpec:
        return self.mesh_for(model).spec

    def _run(self, model: CNN, mode: Mode, split: Split, indices: np.ndarray,
             failout: np.ndarray | None = None) -> WaveResult:
        mesh = self.mesh_for(model)
        # As the virtual mesh: tiny products need no BLAS threads, and a wave's many
        # short-lived objects form no cycles for the collector to find.
        with self._threadpools.limit(limits=1), cyclic_gc_paused():
            return mesh.run_wave(mode, split, indices, failout)

    @property
    def last_wave_shape(self) -> WaveShape:
        """Simulated seconds of the last wave (its edge's update included), and when
        in it the head started and its gradient was ready."""
        if self.mesh is None or not self.mesh.waves:
            return WaveShape(0.0, 0.0, 0.0)
        last = self.mesh.waves[-1]
        seconds = last.end - last.start
        gather = last.forward if last.forward is not None else seconds
        return WaveShape(seconds, gather, last.backward if last.backward is not None
                         else gather)

    def report(self) -> dict[str, Any]:
        """The "comm" record of metrics.json, as the virtual mesh gives it; the wave's
        depth in simulated seconds (there are no rounds here)."""
        if self.mesh is None:
            return {}
        comm = self.mesh.ledger.report()
        topo = self.mesh.spec.topology
        last = self.mesh.waves[-1] if self.mesh.waves else None
        comm["wave_depth"] = {
            "diameter": topo.diameter,
            "edge_hops_to_far_corner": max(topo.depth.values()),
            "wave": None if last is None else last.mode.name.lower(),
            "forward_s": None if last is None else last.forward,
            "wave_s": None if last is None else last.end - last.start}
        return comm

    def close(self) -> None:
        """Nothing to release: no loop, no sockets."""


def sim_report(mesh: TimedMesh, mode: Mode, baseline: dict[str, Any] | None = None,
               epochs: int | None = None) -> dict[str, Any]:
    """sim.json: the profiles used, makespans, energy per node, bytes and frames, over
    the waves of `mode` (training: the training waves; the evaluation waves between
    epochs are reported apart, under "evaluation")."""
    waves = [w for w in mesh.waves if w.mode == mode]
    usage = mesh.usage.get(mode, Usage())
    spans = [w.end - w.start for w in waves]
    forwards = [w.forward for w in waves if w.forward is not None]
    report: dict[str, Any] = {
        "radio": mesh.radio.model_dump(),
        "medium": mesh.medium_name,
        "device": mesh.device.name,
        "edge_device": mesh.edge_device.name,
        "mode": mode.name.lower(),
        "waves": len(waves),
        "makespan_s": {"per_wave_mean": _mean(spans), "forward_mean": _mean(forwards),
                       "total": usage.seconds},
        "energy_j": mode_energy(mesh, usage),
        **_traffic(usage),
        "faults": _faults(mesh),
        "events": mesh.queue.events,  # of the whole run, evaluation included
    }

    for m in [m for m in mesh.usage if m != mode]:  # training runs evaluate, apart
        other = mesh.usage[m]
        report["evaluation" if m == Mode.INFER else m.name.lower()] = {
            "waves": other.waves, "makespan_s": other.seconds,
            "energy_j": {k: v for k, v in mode_energy(mesh, other).items()
                         if k != "per_node"}, **_traffic(other)}
    if epochs:  # a training run: its figures per epoch too
        report["makespan_s"]["per_epoch_mean"] = usage.seconds / epochs
        report["energy_j"]["per_epoch_mean"] = report["energy_j"]["total"] / epochs
    if baseline is not None:
        report["baseline"] = baseline
    return report


def run_makespan(span: dict[str, float], parallel: dict[str, Any], epochs: int | None
                 ) -> dict[str, float]:
    """sim.json's `makespan_s` of several meshes: `total` (and `per_epoch_mean`) the
    run's elapsed simulated time, `parallel.elapsed` (the meshes' waves, their waits
    for the sync rule or for weights, the backhaul), which is where `--overlap` shows;
    the first mesh's own waves' seconds, the figure `total` held before, kept as
    `first_mesh_waves` (and in `meshes[0].makespan_s`)."""
    elapsed = parallel["elapsed"]
    record = {**span, "total": elapsed, "first_mesh_waves": span["total"]}
    if epochs:
        record["per_epoch_mean"] = elapsed / epochs
    return record


def mesh_summary(engine: SimEngine) -> dict[str, Any]:
    """One mesh of several, in sim.json's "meshes": its radio and what its training
    waves took."""
    mesh = engine.mesh
    if mesh is None:
        return {"mesh_id": engine.mesh_id, "waves": 0}
    usage = mesh.usage.get(Mode.TRAIN, Usage())
    return {"mesh_id": engine.mesh_id, "radio": mesh.radio.name, "waves": usage.waves,
            "makespan_s": usage.seconds,
            "energy_j": mode_energy(mesh, usage)["total"],
            "frames": sum(figures.frames for figures in usage.by_kind.values()),
            "bytes": sum(figures.bytes for figures in usage.by_kind.values())}


def _faults(mesh: TimedMesh) -> dict[str, Any]:
    """What the links lost, the link layer sent again and the senders recovered end to
    end (reliable mode); what stayed lost, and what the parties filled in at their
    deadlines (best effort). Of the whole run, evaluation included."""
    faults = mesh.medium.faults
    best_effort = mesh.best_effort
    by_kind: Counter[str] = Counter()
    per_node: dict[str, int] = {}
    late = absent = 0
    for cell in mesh.nodes:
        counts = mesh.counts(cell)
        late += counts["late"]
        absent += counts["absent_filled"]
        if counts["filled_in"]:
            per_node[name_of(cell)] = counts["filled_in"]
        by_kind.update({k.split(":")[1]: v for k, v in counts.items()
                        if k.startswith("filled_in:")})
    edge = mesh.edge.stats
    by_kind.update({f"{k.split(':')[1]} at the edge": v for k, v in edge.items()
                    if k.startswith("filled_in:")})
    waves = [w.filled_in for w in mesh.waves]
    return {
        "recovery": "reliable" if best_effort is None else "best-effort",
        "policy": None if best_effort is None else str(best_effort.policy),
        "patience": None if best_effort is None else best_effort.patience,
        "lost": faults["frames_lost"],
        "retransmitted": faults["retransmitted"],
        "recovered": faults["frames_recovered"] + faults["messages_resent"],
        "frames_recovered": faults["frames_recovered"],
        "messages_resent": faults["messages_resent"],
        # Given up by their senders: past the retry limit when their receivers had
        # given up on them, or never sent at all for that reason; and lost to a node
        # that was down.
        "messages_lost": faults["messages_lost"],
        "messages_expired": faults["messages_expired"],
        "messages_to_dead": faults["messages_to_dead"],
        "substituted": sum(by_kind.values()),
        "substituted_by_kind": dict(sorted(by_kind.items())),
        "substituted_per_node": per_node,
        "substituted_per_wave_mean": _mean(waves) if waves else 0.0,
        "substituted_per_wave_max": max(waves, default=0),
        "late": late,
        # Values of absent cells (dead, cut off, or relayed only through them) filled
        # in each time a kernel read them, and pooled blocks without a live cell.
        "absent_filled": absent,
        "absent_blocks_filled": edge["absent_blocks_filled"],
        "skipped_steps": edge["skipped_steps"],
        # The cells the edge planned around at the end (found dead, or announced), and
        # the nodes down at the end in fact.
        "dead_cells": [name_of(cell) for cell in sorted(mesh.edge.spec.dead)],
        "down_cells": [name_of(cell) for cell in sorted(mesh.down)],
        "edge_at": name_of(mesh.edge.spec.edge_at),
        "cut_off_cells": [name_of(cell) for cell in
                          sorted(mesh.edge.spec.topology.cut_off)],
        "stragglers": [name_of(cell) for cell in mesh.slowdown],
        "straggler_slowdown": mesh.stragglers.slowdown if mesh.slowdown else None,
        "loss": None if mesh.medium.loss is None else {
            "rate": mesh.medium.loss.rate, "burst": mesh.medium.loss.burst,
            "seed": mesh.medium.loss.seed}}


def mode_energy(mesh: TimedMesh, usage: Usage) -> dict[str, Any]:
    """Joules over the waves of `usage` (sim/radio/energy.py)."""
    record = energy.energy_record(mesh.radio, mesh.device, mesh.edge_device, mesh.hosts,
                                  EDGE, usage.tx, usage.rx, usage.cpu, usage.seconds,
                                  usage.down)
    record["per_wave_mean"] = record["total"] / max(usage.waves, 1)
    return record


def _traffic(usage: Usage) -> dict[str, Any]:
    """Bytes (unframed) and frames per message class, transmissions and frames, of the
    waves of `usage`."""
    sizes: dict[str, int] = {}
    frames: dict[str, int] = {}
    for (kind, layer), figures in usage.by_kind.items():
        name = class_name(Kind(kind), layer)
        sizes[name] = sizes.get(name, 0) + figures.bytes
        frames[name] = frames.get(name, 0) + figures.frames
    return {"bytes": dict(sorted(sizes.items())), "frames": dict(sorted(frames.items())),
            "transmissions": usage.transmissions, "frames_total": sum(frames.values())}


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def write_trace(trace: list[Sent], path: Path) -> None:
    """trace.jsonl: one line per transmission, in the order they went on air."""
    with path.open("w") as out:
        for s in trace:
            record = {"t0": round(s.t0, 9), "t1": round(s.t1, 9), "src": _name(s.src),
                      "dst": "*" if s.broadcast else _name(s.receivers[0]),
                      "kind": Kind(s.kind).name.lower(), "layer": s.layer,
                      "bytes": s.size, "frames": s.frames, "outcome": s.outcome,
                      "to": [_name(r) for r in s.receivers]}
            out.write(json.dumps(record) + "\n")


def _name(party: Cell) -> str:
    return "broker" if party == BROKER else name_of(party)


def plot_energy(mesh_report: dict[str, Any], rows: int, cols: int, path: Path) -> None:
    """energy.png: joules per node over the grid, its colours over the nodes' spread
    (meshdl/report/maps.py's `energy_figure`, which `meshdl report` draws too)."""
    save_png(energy_figure(mesh_report, rows, cols), path)
