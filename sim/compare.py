"""In-mesh computing next to the cloud-heavy baseline, on every radio and network shape.

For one mesh shape on one radio: an inference slot (one wave of a batch of time slots,
against shipping those readings to the edge and computing there) and one training
epoch (every step a wave through the mesh, against shipping the raw training set once
and training at the edge). The values in the readings do not change what is sent, so
the mesh runs on zeros; every figure is measured in simulated time (sim/timed.py,
sim/cloud.py), none is a formula.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from meshdl.config import ModelConfig
from meshdl.messages import EDGE, Kind
from meshdl.model import CNN
from meshdl.protocol import MeshSpec, Mode, Split
from meshdl.sim import cloud
from meshdl.sim.device import DeviceProfile
from meshdl.sim.energy import energy_record
from meshdl.sim.media import MediumName
from meshdl.sim.radio import RadioProfile
from meshdl.sim.timed import TimedMesh, Usage


def _mesh(model: ModelConfig, radio: RadioProfile, medium: MediumName,
          node: DeviceProfile, edge: DeviceProfile, samples: int, seed: int) -> TimedMesh:
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
    mesh = _mesh(model, radio, medium, node, edge, batch, seed)
    mesh.run_wave(Mode.INFER, Split.TEST, np.arange(batch))
    out = {"in_mesh": _figures(mesh, mesh.usage[Mode.INFER])}
    for variant in _variants(medium):
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
    mesh = _mesh(model, radio, medium, node, edge, train_samples, seed)
    steps = math.ceil(train_samples / batch)
    order = np.random.default_rng(seed).permutation(train_samples)
    for step in range(steps):
        mesh.run_wave(Mode.TRAIN, Split.TRAIN, order[step * batch:(step + 1) * batch])
    epoch = _figures(mesh, mesh.usage[Mode.TRAIN])
    out: dict[str, Any] = {"steps": steps, "in_mesh": epoch}
    for variant in _variants(medium):
        run = cloud.training_run(mesh.spec, radio, medium, node, edge, train_samples, steps,
                                 batch, variant, seed)
        out[f"cloud_{variant}"] = _cloud_figures(run)
    if epochs > 1:
        whole: dict[str, Any] = {"epochs": epochs, "in_mesh": {
            k: v * epochs if isinstance(v, int | float) else v for k, v in epoch.items()}}
        for variant in _variants(medium):
            run = cloud.training_run(mesh.spec, radio, medium, node, edge, train_samples,
                                     steps * epochs, batch, variant, seed)
            whole[f"cloud_{variant}"] = _cloud_figures(run)
        out["run"] = whole
    return out


def _variants(medium: MediumName) -> list[cloud.Variant]:
    return ["aggregated", "unaggregated"] if medium == "shared" else ["unaggregated"]


METRICS = ("bytes", "makespan_s", "max_node_airtime_s", "energy_j", "ideal_mac_j",
           "ideal_mac_max_node_j")


def wins(record: dict[str, Any]) -> dict[str, bool]:
    """Per metric: does the mesh cost less than the best cloud-heavy variant?"""
    clouds = [v for k, v in record.items() if k.startswith("cloud_")]
    return {metric: record["in_mesh"][metric] < min(c[metric] for c in clouds)
            for metric in METRICS}
