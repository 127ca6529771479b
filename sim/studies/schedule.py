"""`meshdl schedule`: the per-layer compression plans of sim/studies/planner.py,
calibrated and checked under simulated time.

For one radio (and, with several meshes, one backhaul) it simulates the seed network's
training waves under each forward-activation format (whose effect on the whole
pipeline is measured rather than modelled), with dense and with all-2-bit gradients
(to calibrate the REDUCE hops on that format's critical path). Every simulation gives
each radio its own backoff stream (`Medium.pair_backoffs`), so plans are compared on
the same draws. It then predicts every plan's step time,
finds the optimal, greedy and uniform plans, and simulates each of those for its
`simulated_step_s`. Forward activations are one more message class of the plan
(HALO, POOL, GATHER: float32, fp16 or int8), as gradients' layers are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from meshdl.compress.compressors import IntSum, Segment, parse_compressor
from meshdl.compress.policy import CompressionPolicy, model_segments
from meshdl.config import RunConfig
from meshdl.data.datasets import Dataset
from meshdl.model.cnn import CNN
from meshdl.protocol.activations import activation_compressor
from meshdl.protocol.messages import HEADER_BYTES, Kind
from meshdl.protocol.spec import MeshSpec
from meshdl.sim.radio.backhaul import BackhaulProfile
from meshdl.sim.radio.device import DeviceProfile
from meshdl.sim.radio.profiles import RadioProfile
from meshdl.sim.studies.planner import (
    ACTIVATIONS,
    CANDIDATES,
    FORMATS,
    MAX_ERROR,
    Link,
    Option,
    Plan,
    StepModel,
    Summed,
    calibrate_hops,
    greedy_plan,
    optimal_plan,
    option_table,
    relative_error,
    tree_error_factor,
    uniform_plans,
)
from meshdl.training.loop import CentralEngine, normalization


@dataclass
class Setting:
    """What the plans are for: the network, its data, the radio and devices, and with
    several meshes the backhaul."""

    config: RunConfig
    data: Dataset
    radio: RadioProfile
    medium: str
    node: DeviceProfile
    edge: DeviceProfile
    backhaul: BackhaulProfile | None
    meshes: int = 1
    waves: int = 2  # simulated per plan
    seed: int = 0


def simulated_wave_s(setting: Setting, compress: str, activations: str) -> tuple[float,
                                                                                  float]:
    """Mean simulated seconds of the seed network's first `waves` training waves under
    a plan, and how long before its end the head's gradient was ready."""
    from meshdl.sim.simulate import SimEngine

    config, data = setting.config, setting.data
    model = _model(config, data)
    engine = SimEngine(data, setting.radio, setting.medium, setting.node, setting.edge,
                       seed=setting.seed,
                       params_via="tree" if setting.medium == "shared" else "broadcast",
                       compress=compress, activations=activations, paired_backoffs=True)
    batch, spans, leads = config.train.batch, [], []
    if CompressionPolicy.parse(compress, config.model).summed:
        # intsum's first wave has no scale yet (every REDUCE all zeros): not timed.
        engine.loss_and_grads(model, np.arange(batch))
    for wave in range(setting.waves):
        engine.loss_and_grads(model, np.arange(wave * batch, (wave + 1) * batch))
        shape = engine.last_wave_shape
        spans.append(shape.seconds)
        leads.append(shape.seconds - shape.head)
    return float(np.mean(spans)), float(np.mean(leads))


def simulated_step_s(setting: Setting, plan: Plan) -> float:
    """A plan's simulated step: its waves alone (one mesh), or the cluster's mean step
    (several meshes, bsp with overlap, over the backhaul)."""
    compress, activations = split_plan(plan.per_layer)
    if setting.meshes == 1:
        return simulated_wave_s(setting, compress, activations)[0]
    from meshdl.sim.simulate import SimEngine
    from meshdl.training.parallel import train_parallel

    n, batch = setting.meshes, setting.config.train.batch
    samples = n * batch * setting.waves
    data = setting.data
    subset = Dataset(data.X_train[:samples], data.y_train[:samples], data.X_test[:1],
                     data.y_test[:1], data.meta)
    config = RunConfig.model_validate({
        **setting.config.model_dump(mode="json"),
        "train": {**setting.config.train.model_dump(), "epochs": 1, "augment": "none"},
        "mesh": {**setting.config.mesh.model_dump(mode="json"), "compress": compress,
                 "activations": activations},
        "parallel": {"meshes": n, "sync": "bsp", "overlap": True}})
    engines = [SimEngine(subset, setting.radio, setting.medium, setting.node,
                         setting.edge, seed=setting.seed + i,
                         mesh_id=config.parallel.first_mesh_id + i,
                         params_via="tree" if setting.medium == "shared" else "broadcast",
                         compress=compress, activations=activations,
                         paired_backoffs=True) for i in range(n)]
    _, history = train_parallel(config, subset, engines,
                                wave_time=lambda engines, i: engines[i].last_wave_shape,
                                time_unit="s", backhaul=setting.backhaul)
    return float(history.parallel["step"]["mean"])


def split_plan(per_layer: dict[str, str]) -> tuple[str, str]:
    """A plan as (--compress, --activations)."""
    gradients = ",".join(f"{k}={v}" for k, v in per_layer.items() if k != ACTIVATIONS)
    return gradients, per_layer.get(ACTIVATIONS, "float32")


def schedule(setting: Setting, candidates: tuple[str, ...] = CANDIDATES,
             max_error: float = MAX_ERROR, check: bool = True) -> dict[str, Any]:
    """The options table and the optimal, greedy and uniform plans, each predicted and
    (`check`) simulated."""
    config = setting.config
    segments = model_segments(config.model)
    summed_specs = [parse_compressor(c).spec for c in candidates
                    if isinstance(parse_compressor(c), IntSum)]
    dense_s, lead_s = simulated_wave_s(setting, "none", "float32")
    two_bit_s, _ = simulated_wave_s(setting, "2bit", "float32")
    # A compressor's operations: the encoding at one end, the decoding at the other
    # (the per-message bookkeeping is paid either way).
    radio_link = Link(lambda nbytes: _radio_message_s(setting.radio, nbytes),
                      lambda ops: ops / setting.node.flops_per_s)
    backhaul = None if setting.meshes == 1 or setting.backhaul is None else setting.backhaul
    probe = StepModel(segments, radio_link, 0.0, dense_s)
    dense = {s.name: parse_compressor("none") for s in segments}
    two_bit = {s.name: parse_compressor("2bit") for s in segments}
    saved = (probe.reduce_hop_s(dense), probe.reduce_hop_s(two_bit))
    hops = calibrate_hops(dense_s, two_bit_s, *saved)
    waves, format_hops = {"float32": dense_s}, {"float32": hops}
    for fmt in FORMATS[1:]:  # each format's forward pipeline, and its REDUCE hops
        waves[fmt] = simulated_wave_s(setting, "none", fmt)[0]
        format_hops[fmt] = calibrate_hops(waves[fmt],
                                          simulated_wave_s(setting, "2bit", fmt)[0], *saved)
    model = StepModel(
        segments, radio_link, hops, dense_s,
        None if backhaul is None else Link(
            lambda nbytes: 8 * nbytes / backhaul.up_bps,
            lambda ops: ops / setting.edge.flops_per_s),
        setting.meshes, backhaul is not None and backhaul.bottleneck in
        ("channel", "server_port"), lead_s, True,
        0.0 if backhaul is None else _return_s(config, backhaul, setting.meshes),
        forward_waves=waves, format_hops=format_hops,
        summed={spec: _summed(config, setting.data, spec) for spec in summed_specs},
        summed_waves={spec: {fmt: simulated_wave_s(setting, spec, fmt)[0] for fmt in FORMATS}
                      for spec in summed_specs})
    gradients = _gradients(config, setting.data)
    topology = MeshSpec(config.mesh.mesh_id, config.model, config.mesh.edge_at).topology
    factor = tree_error_factor(list(topology.subtree_sizes.values()))
    options = option_table(segments, candidates, gradients, model, factor) + \
        _activation_options(config, setting.data, waves)
    plans = {"optimal": optimal_plan(options, model, max_error),
             "greedy": greedy_plan(options, model, max_error)}
    uniform = uniform_plans(candidates, model)
    simulated: dict[str, float] = {}

    def record(plan: Plan) -> dict[str, Any]:
        key = plan.spec
        if key not in simulated:
            simulated[key] = simulated_step_s(setting, plan) if check else float("nan")
        return {"per_layer": plan.per_layer, "compress": split_plan(plan.per_layer)[0],
                "activations": split_plan(plan.per_layer)[1],
                "predicted_step_s": plan.predicted_step_s,
                "simulated_step_s": simulated[key]}

    return {
        "radio": setting.radio.name, "medium": setting.medium, "device": setting.node.name,
        "backhaul": None if backhaul is None else backhaul.name, "meshes": setting.meshes,
        "batch": config.train.batch, "max_error": max_error,
        "tree_error_factor": factor,
        "summed_wave_s": model.summed_waves,
        "summed": {spec: figures._asdict() for spec, figures in model.summed.items()},
        "calibration": {"dense_wave_s": dense_s, "two_bit_wave_s": two_bit_s,
                        "critical_reduce_hops": format_hops, "head_lead_s": lead_s,
                        "activation_wave_s": waves},
        "options": [option.__dict__ for option in options],
        "plans": {"optimal": record(plans["optimal"]), "greedy": record(plans["greedy"]),
                  "uniform": {name: record(plan) for name, plan in uniform.items()}},
    }


def _activation_options(config: RunConfig, data: Dataset, waves: dict[str, float]
                        ) -> list[Option]:
    """The forward class's options: each format's bytes per value, its error on the
    seed network's activations, and the simulated wave it gives."""
    sample = _activation_sample(config, data)
    rows = []
    for fmt in FORMATS:
        compressor = activation_compressor(fmt)
        if compressor is None:
            error, nbytes = 0.0, 4
        else:
            error = float(np.mean([
                relative_error(compressor, Segment(ACTIVATIONS, "activation", (a.size,)),
                               [a]) for a in sample]))
            nbytes = {"fp16": 2, "int8": 1}[fmt]
        rows.append(Option(ACTIVATIONS, fmt, nbytes, error, 0.0,
                           waves[fmt] - waves["float32"], 0.0))
    return rows


def _activation_sample(config: RunConfig, data: Dataset) -> list[np.ndarray]:
    """What HALOs carry, one cell's (channels x batch) values at a time: the
    normalized input and every conv layer's output, at a few cells."""
    model = _model(config, data)
    trace = model.forward_trace(model.to_batch_last(data.X_train[:64]))
    out = []
    for a in trace.activations[:-1]:  # (c, rows, cols, B): what HALOs carry
        rows, cols = a.shape[1], a.shape[2]
        for r, c in ((1, 1), (rows // 2, cols // 2), (rows - 1, 0)):
            out.append(np.ascontiguousarray(a[:, r, c, :], np.float32).reshape(-1))
    return out


def _gradients(config: RunConfig, data: Dataset, batches: int = 6
               ) -> dict[str, list[np.ndarray]]:
    """Each layer's gradient on the seed network's first batches (the initial weights)."""
    model = _model(config, data)
    engine = CentralEngine(data)
    batch = config.train.batch
    out: dict[str, list[np.ndarray]] = {s.name: [] for s in model_segments(config.model)}
    for b in range(batches):
        grads = engine.loss_and_grads(model, np.arange(b * batch, (b + 1) * batch))[2]
        at = 0
        for segment in model_segments(config.model):
            out[segment.name].append(grads[at:at + segment.size].copy())
            at += segment.size
    return out


def _summed(config: RunConfig, data: Dataset, spec: str, waves: int = 6) -> Summed:
    """intsum measured in the in-process mesh on the seed network's first batches (the
    initial weights, held still): the mean REDUCE payload and each conv layer's mean
    relative error at the edge against the exact gradient, from the second wave on (the
    first has no scale yet). As for the other options, the error is one compression's:
    every node's residual is cleared before each wave, so that it holds the error of
    quantizing each share once, not the earlier waves' rest that error feedback adds."""
    from meshdl.sim.mesh import MeshEngine

    model = _model(config, data)
    engine = MeshEngine(data, config.mesh.edge_at, config.mesh.mesh_id,
                        compress=spec)
    central = CentralEngine(data)
    conv = tuple(s for s in model_segments(config.model) if s.kind == "conv")
    size = sum(s.size for s in conv)
    batch, samples = config.train.batch, len(data.y_train)
    errors: dict[str, list[float]] = {s.name: [] for s in conv}
    try:
        for wave in range(waves):
            indices = np.arange(wave * batch, (wave + 1) * batch) % samples
            for node in engine.mesh.nodes.values() if engine.mesh else ():
                if node.sum_channel is not None:
                    node.sum_channel.residual[:] = 0.0
            got = engine.loss_and_grads(model, indices)[2][:size].copy()
            exact = central.loss_and_grads(model, indices)[2][:size]
            if wave == 0:
                first = engine.mesh.ledger.sent_by(Kind.REDUCE)
                continue
            at = 0
            for segment in conv:
                part = slice(at, at + segment.size)
                norm = float(np.linalg.norm(exact[part]))
                if norm > 0:
                    errors[segment.name].append(
                        float(np.linalg.norm(got[part] - exact[part])) / norm)
                at += segment.size
        total = engine.mesh.ledger.sent_by(Kind.REDUCE)
        topology = engine.spec_for(model).topology
    finally:
        engine.close()
    sent = {cell: (nbytes - first[cell][0], messages - first[cell][1])
            for cell, (nbytes, messages) in total.items()}
    messages = sum(m for _, m in sent.values())
    payload = sum(b for b, _ in sent.values()) / max(messages, 1) - HEADER_BYTES
    # The longest path, root first: the hops a wave's REDUCE ends with.
    cell = max(topology.subtree_sizes, key=lambda c: (topology.depth[c], c))
    path = []
    while cell in sent:
        path.append(sent[cell][0] / max(sent[cell][1], 1) - HEADER_BYTES)
        cell = topology.parent[cell]
    return Summed(payload, {name: float(np.mean(e)) if e else 0.0
                            for name, e in errors.items()}, tuple(reversed(path)))


def _model(config: RunConfig, data: Dataset) -> CNN:
    model = CNN(config.model, seed=config.train.seed)
    model.set_normalization(*normalization(data.X_train))
    return model


def _radio_message_s(radio: RadioProfile, nbytes: int) -> float:
    """A unicast message's hold on the radio: its channel time, or its airtime plus the
    duty cycle's wait, whichever is longer."""
    from meshdl.sim.radio.media import airtime

    air = airtime(radio, nbytes, True)
    return max(air.channel, air.on_air + radio.off_time_s(air.on_air))


def _return_s(config: RunConfig, backhaul: BackhaulProfile, meshes: int) -> float:
    """The weights back to every edge (float32, never compressed) and the two
    latencies of a step's round trip."""
    values = sum(s.size for s in model_segments(config.model))
    nbytes = HEADER_BYTES + 4 * values
    queued = meshes if backhaul.bottleneck in ("channel", "server_port") else 1
    return queued * 8 * nbytes / backhaul.down_bps + 2 * backhaul.latency_s


def resolve_plan(config: RunConfig, data: Dataset, radio: RadioProfile, medium: str,
                 backhaul: BackhaulProfile | None) -> tuple[RunConfig, dict[str, str]]:
    """`--compress plan`: the run's configuration with the optimal plan for its network,
    batch and meshes on `radio` (and `backhaul`) in place of "plan" (the forward
    activations too, unless the run set them), and the plan."""
    from meshdl.sim.radio.device import device, natural_device

    meshes = config.parallel.meshes
    setting = Setting(config, data, radio, medium, device(natural_device(radio.name)),
                      device("pi4"), backhaul if meshes > 1 else None, meshes, 1,
                      config.train.seed)
    plan = schedule(setting, check=False)["plans"]["optimal"]
    mesh = {"compress": plan["compress"]}
    if config.mesh.activations == "float32":
        mesh["activations"] = plan["activations"]
    resolved = config.model_copy(update={"mesh": config.mesh.model_copy(update=mesh)})
    return resolved, plan["per_layer"]

