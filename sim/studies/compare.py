"""In-mesh computing next to the cloud-heavy baseline, on every radio and network shape.

For one mesh shape on one radio: an inference slot (one wave of a batch of time slots,
against shipping those readings to the edge and computing there) and one training
epoch (every step a wave through the mesh, against shipping the raw training set once
and training at the edge). The values in the readings do not change what is sent, so
the mesh runs on zeros; every figure is measured in simulated time (sim/timed.py,
sim/studies/cloud.py), none is a formula.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from meshdl.config import ModelConfig
from meshdl.model.cnn import CNN
from meshdl.protocol.messages import EDGE, Kind
from meshdl.protocol.spec import MeshSpec, Mode, Split
from meshdl.report.numbers import figure
from meshdl.sim.radio.device import DeviceProfile
from meshdl.sim.radio.energy import energy_record
from meshdl.sim.radio.media import MediumName
from meshdl.sim.radio.profiles import RadioProfile
from meshdl.sim.studies import cloud
from meshdl.sim.timed import TimedMesh, Usage


def zero_mesh(model: ModelConfig, radio: RadioProfile, medium: MediumName,
          node: DeviceProfile, edge: DeviceProfile, samples: int, seed: int) -> TimedMesh:
    """A mesh of `model` whose readings are zeros (what is sent does not depend on them),
    parameters flooded down the tree on a radio mesh, published once through a broker."""
    params_via = "tree" if medium == "shared" else "broadcast"
    spec = MeshSpec(1, model, (0, 0), params_via)
    shape = (samples, model.in_channels, model.rows, model.cols) if model.in_channels > 1 \
        else (samples, model.rows, model.cols)
    zeros = np.zeros(shape, np.float32)
    labels = np.zeros(samples, np.int64)
    return TimedMesh(spec, {Split.TRAIN: zeros, Split.TEST: zeros}, CNN(model, seed=seed),
                     {Split.TRAIN: labels, Split.TEST: labels}, radio, medium, node, edge,
                     seed=seed)


def _figures(mesh: TimedMesh, usage: Usage) -> dict[str, Any]:
    """The measures compared, of the waves of `usage`. Energy is the sensor nodes'
    (the battery-powered ones); the edge is the same mains-powered gateway either way
    and is reported in sim.json."""
    energy = energy_record(mesh.radio, mesh.device, mesh.edge_device, mesh.hosts,
                           EDGE, usage.tx, usage.rx, usage.cpu, usage.seconds)
    params = sum(f.bytes for (kind, _), f in usage.by_kind.items() if kind == Kind.PARAMS)
    return {"makespan_s": usage.seconds,
            "bytes": sum(f.bytes for f in usage.by_kind.values()),
            "params_bytes": params,
            "frames": sum(f.frames for f in usage.by_kind.values()),
            "transmissions": usage.transmissions,
            "energy_j": energy["nodes"], "max_node_j": energy["max_node"],
            "ideal_mac_j": energy["ideal_mac"]["nodes"],
            "ideal_mac_max_node_j": energy["ideal_mac"]["max_node"],
            "max_node_airtime_s": energy["airtime_s"]["max_node"],
            "max_node_airtime_cell": energy["airtime_s"]["max_node_cell"]}


def _cloud_figures(record: dict[str, Any]) -> dict[str, Any]:
    energy = record["energy_j"]
    return {"makespan_s": record["makespan_s"], "bytes": record["bytes"],
            "frames": record["frames"], "transmissions": record["transmissions"],
            "energy_j": energy["nodes"], "max_node_j": energy["max_node"],
            "ideal_mac_j": energy["ideal_mac"]["nodes"],
            "ideal_mac_max_node_j": energy["ideal_mac"]["max_node"],
            "max_node_airtime_s": energy["airtime_s"]["max_node"],
            "max_node_airtime_cell": energy["airtime_s"]["max_node_cell"]}


def inference_slot(model: ModelConfig, radio: RadioProfile, medium: MediumName,
                   node: DeviceProfile, edge: DeviceProfile, batch: int = 1,
                   seed: int = 0) -> dict[str, Any]:
    """One inference wave of `batch` samples in the mesh, and the same slot shipped."""
    mesh = zero_mesh(model, radio, medium, node, edge, batch, seed)
    mesh.run_wave(Mode.INFER, Split.TEST, np.arange(batch))
    out = {"in_mesh": _figures(mesh, mesh.usage[Mode.INFER])}
    for variant in variants(medium):
        slot = cloud.inference_slot(mesh.spec, radio, medium, node, edge, batch, variant, seed)
        out[f"cloud_{variant}"] = _cloud_figures(slot)
    return out


def training_epoch(model: ModelConfig, radio: RadioProfile, medium: MediumName,
                   node: DeviceProfile, edge: DeviceProfile, train_samples: int,
                   batch: int, seed: int = 0, epochs: int = 1) -> dict[str, Any]:
    """Every step of one epoch as a wave in the mesh, and the training set shipped once
    then trained on at the edge for the same steps. With `epochs` > 1, also the whole
    run: the mesh's epoch times `epochs` (every epoch sends the same messages), against
    the training set shipped once and `epochs` epochs at the edge."""
    mesh = zero_mesh(model, radio, medium, node, edge, train_samples, seed)
    steps = math.ceil(train_samples / batch)
    order = np.random.default_rng(seed).permutation(train_samples)
    for step in range(steps):
        mesh.run_wave(Mode.TRAIN, Split.TRAIN, order[step * batch:(step + 1) * batch])
    epoch = _figures(mesh, mesh.usage[Mode.TRAIN])
    out: dict[str, Any] = {"steps": steps, "in_mesh": epoch}
    for variant in variants(medium):
        run = cloud.training_run(mesh.spec, radio, medium, node, edge, train_samples, steps,
                                 batch, variant, seed)
        out[f"cloud_{variant}"] = _cloud_figures(run)
    if epochs > 1:
        whole: dict[str, Any] = {"epochs": epochs, "in_mesh": {
            k: v * epochs if isinstance(v, int | float) else v for k, v in epoch.items()}}
        for variant in variants(medium):
            run = cloud.training_run(mesh.spec, radio, medium, node, edge, train_samples,
                                     steps * epochs, batch, variant, seed)
            whole[f"cloud_{variant}"] = _cloud_figures(run)
        out["run"] = whole
    return out


def variants(medium: MediumName) -> list[cloud.Variant]:
    """The cloud-heavy variants a medium has: through a broker there is no tree to
    aggregate along."""
    return ["aggregated", "unaggregated"] if medium == "shared" else ["unaggregated"]


METRICS = ("bytes", "makespan_s", "max_node_airtime_s", "energy_j", "ideal_mac_j",
           "ideal_mac_max_node_j")


def wins(record: dict[str, Any]) -> dict[str, bool]:
    """Per metric: does the mesh cost less than the best cloud-heavy variant?"""
    clouds = [v for k, v in record.items() if k.startswith("cloud_")]
    return {metric: record["in_mesh"][metric] < min(c[metric] for c in clouds)
            for metric in METRICS}


def sweep(rows: int, cols: int, hidden: int, radio: RadioProfile, medium: MediumName,
          node: DeviceProfile, edge: DeviceProfile, batch: int = 1, seed: int = 0
          ) -> list[dict[str, Any]]:
    """The inference slot over network shapes (k 1 or 3, 1 or 2 conv layers, 1, 2 or 5
    filters, pooling 2, 3 or 4): where the mesh costs less, measure by measure."""
    out = []
    for kernel, conv_layers, filters, pool in itertools.product((1, 3), (1, 2), (1, 2, 5),
                                                                 (2, 3, 4)):
        model = ModelConfig(rows=rows, cols=cols, kernel=kernel, filters=filters, pool=pool,
                            conv_layers=conv_layers, hidden=hidden)
        record = inference_slot(model, radio, medium, node, edge, batch, seed)
        out.append({"kernel": kernel, "conv_layers": conv_layers, "filters": filters,
                    "pool": pool, "radio": radio.name, "inference": record,
                    "mesh_wins": wins(record)})
    return out


def markdown(results: dict[str, Any]) -> str:
    """`meshdl simulate compare`'s results as the markdown tables of SIMULATION.md."""
    head = ("| radio | what | bytes (of them PARAMS) | makespan (s) | busiest node airtime "
            "(s) | nodes' energy, always-on (J) | hottest node (J) | nodes' energy, ideal "
            "MAC (J) | hottest node, ideal MAC (J) |")
    lines: list[str] = []
    for section, title in (("inference", "Inference slot"), ("epoch", "One training epoch"),
                           ("run", "The whole training run")):
        entries = [e for e in results["radios"] if section in e]
        if not entries:
            continue
        lines += [f"### {title}", "", head, "|" + " --- |" * 9]
        for e in entries:
            label = f"{e['radio']} ({e['medium']}, {e['device']})"
            for key, record in e[section].items():
                if isinstance(record, dict) and "bytes" in record:
                    lines.append(_row(label, key.replace("_", " "), record))
        lines.append("")
    if results.get("sweep"):
        lines += ["### Where the mesh wins (inference slot)", "",
                  "| k | conv layers | filters | pool | " + " | ".join(METRICS) + " |",
                  "|" + " --- |" * (4 + len(METRICS))]
        for s in results["sweep"]:
            won = s["mesh_wins"]
            lines.append(f"| {s['kernel']} | {s['conv_layers']} | {s['filters']} | "
                         f"{s['pool']} | " + " | ".join(
                             "mesh" if won[m] else "cloud" for m in METRICS) + " |")
        lines.append("")
    return "\n".join(lines)


def _row(radio: str, what: str, f: dict[str, Any]) -> str:
    params = f" ({f['params_bytes']:,})" if "params_bytes" in f else ""
    return (f"| {radio} | {what} | {f['bytes']:,}{params} | {figure(f['makespan_s'])} | "
            f"{figure(f['max_node_airtime_s'])} ({f['max_node_airtime_cell']}) | "
            f"{figure(f['energy_j'])} | {figure(f['max_node_j'])} | "
            f"{figure(f['ideal_mac_j'])} | {figure(f['ideal_mac_max_node_j'])} |")
