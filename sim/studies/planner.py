"""The per-layer compression plan that minimizes training time (seed 000), next to the
greedy choice and to every single compressor for all layers.

A plan gives each layer's gradient one compressor. What it changes in a training step:

- in the mesh, the REDUCE that carries the conv layers up the tree: every hop's message
  is the header plus the conv layers' payloads, and takes the radio's channel time for
  that many bytes (frames, ACKs, inter-frame spaces, the duty cycle's wait) plus the
  encoding at the child and the decoding at the parent on the node's CPU;
- with several meshes, each edge's PUSH to the parameter server over the backhaul: with
  layer-wise overlap the head's part (fc layers) goes while the conv backward still runs
  in the mesh, and only what is left of it when the REDUCE is in delays the step; the
  conv part goes after the REDUCE; N meshes' pushes share the bottleneck.

`StepModel.predict` is that model. Its one free constant, the number of REDUCE hops on
the wave's critical path (the convergecast is pipelined: not every hop's time adds up),
is calibrated from two simulated waves, the dense one and the all-2-bit one; everything
else comes from the radio, backhaul and device profiles. The options table gives each
(layer, compressor): payload bytes, the time its bytes hold the radio or the backhaul,
its compression time, and the part of that communication the overlap hides. The
accuracy constraint is L-GreCo's per-layer error budget: an option is allowed when the
relative L2 error it makes of one step's gradient (measured on gradients of the seed
network's first steps) is within `max_error` (error feedback makes every option
unbiased over a run; the budget bounds how much of a step waits for later ones).

The in-network sum (intsum) has no fixed size: its bytes and its error are measured in
a few waves of the mesh (`Summed`), and it is the whole REDUCE's or no layer's.

The space is small (at most 10 compressors for each of the model's layers), so the
optimum is found exhaustively; greedy takes, layer by layer, the option of least time
for that layer alone (its bytes' communication plus its compression), blind to the
overlap and to the frames the layers share.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from meshdl.compress.codec import VectorCodec
from meshdl.compress.compressors import Compressor, IntSum, Segment, parse_compressor
from meshdl.compress.intsum import SumCodec
from meshdl.protocol.messages import HEADER_BYTES, ITEM_BYTES
from meshdl.protocol.payloads import PUSH_HEAD

ACTIVATIONS = "activations"  # the plan's class of forward activations
FORMATS = ("float32", "fp16", "int8")
# The per-layer error budget by default: what reached the edge learned as well as
# float32 at 0.04 (int8 in the REDUCE of the seed mesh), and lost 1.7 points at about 1.1
# (Hylo's one kernel in 25) and everything at 1.9 (2-bit): 0.5 lies between.
MAX_ERROR = 0.5
CANDIDATES = ("none", "fp16", "int8", "2bit", "topk:0.1", "ktopk", "powersgd:1",
              "powersgd:2", "intsum", "intsum:15")


class Summed(NamedTuple):
    """The in-network sum (intsum) as measured in a few waves of the mesh: its code's
    size depends on the values (compress/intsum.py), so neither its bytes nor its error
    follow from the compressor alone."""

    payload_bytes: float  # mean REDUCE payload, every conv layer
    error: dict[str, float]  # conv layer -> relative L2 error at the edge, per wave
    # Mean payload of each hop of the tree's longest path, from the root's down: sums
    # grow towards the root, and the hops on a wave's critical path are the last ones.
    path_bytes: tuple[float, ...] = ()

    def critical_bytes(self, hops: float) -> float:
        """Mean payload of the last `hops` hops into the edge (all: the mean)."""
        last = self.path_bytes[:max(1, round(hops))]
        return float(np.mean(last)) if last else self.payload_bytes


@dataclass(frozen=True)
class Link:
    """The time a message of some bytes holds a link, and the CPU time of the operations
    around it, as the profiles give them."""

    message_s: Callable[[int], float]  # bytes (header included) -> seconds
    cpu_s: Callable[[int], float]  # operations -> seconds on the computer at each end


@dataclass(frozen=True)
class Option:
    """One compressor for one layer."""

    layer: str
    compressor: str
    bytes: int  # its payload for this layer
    error: float  # relative L2 error of one step's gradient as it reaches the edge
    compression_s: float  # encode + decode, on the devices at each end
    communication_s: float  # its bytes on their route alone (radio per hop, or backhaul)
    overlapped_s: float  # of that, what the overlap hides in a step


@dataclass(frozen=True)
class StepModel:
    """Predicted seconds of one training step for a plan (layer -> compressor)."""

    segments: tuple[Segment, ...]
    radio: Link  # a REDUCE hop: node to node
    critical_hops: float  # REDUCE hops on the wave's critical path (calibrated)
    dense_wave_s: float  # the simulated wave with float32 REDUCE
    backhaul: Link | None = None  # edge -> server, None for one mesh
    meshes: int = 1
    shared: bool = False  # do the N meshes' pushes share one bottleneck?
    head_lead_s: float = 0.0  # from the head's gradient to the REDUCE's arrival
    overlap: bool = True
    return_s: float = 0.0  # the server's weights back to the edges, and the latencies
    # Forward activations (HALO, POOL, GATHER), one more class of the plan: the
    # simulated dense-gradient wave of each format, which shapes the whole pipeline.
    forward_waves: dict[str, float] = field(default_factory=dict)
    # The REDUCE hops on the critical path under each format (they shift as the
    # forward pipeline does); `critical_hops` where a format has none.
    format_hops: dict[str, float] = field(default_factory=dict)
    # intsum's measured figures per candidate spec ("intsum", "intsum:15", ...), and
    # its simulated training wave under each forward format: PARAMS carries the scales,
    # and on a shared radio those few bytes more reorder the whole forward pipeline
    # (BLE: 2.3 s more of a 27 s forward wave), which no per-hop sum foresees.
    summed: dict[str, Summed] = field(default_factory=dict)
    summed_waves: dict[str, dict[str, float]] = field(default_factory=dict)

    def summed_spec(self, plan: dict[str, Compressor]) -> str | None:
        """The intsum spec every conv layer of `plan` takes, if one does."""
        specs = {plan[s.name].spec for s in self.segments if s.kind == "conv"}
        spec = specs.pop() if len(specs) == 1 else None
        return spec if spec in self.summed else None

    def reduce_hop_s(self, plan: dict[str, Compressor], hops: float | None = None) -> float:
        """One REDUCE hop: the message's channel time and its encoding and decoding
        (under intsum, of the payload measured on the last `hops` hops into the edge).
        """
        conv = [s for s in self.segments if s.kind == "conv"]
        spec = self.summed_spec(plan)
        if spec is not None:
            summed = self.summed[spec]
            codec = SumCodec(tuple(conv), tuple(plan[s.name].levels for s in conv))
            payload = summed.critical_bytes(self.critical_hops if hops is None else hops)
            return self.radio.message_s(HEADER_BYTES + round(payload)) + \
                self.radio.cpu_s(codec.operations)
        codec = VectorCodec(tuple(conv), tuple(plan[s.name] for s in conv))
        return self.radio.message_s(HEADER_BYTES + codec.nbytes) + \
            self.radio.cpu_s(codec.operations)

    def push_s(self, plan: dict[str, Compressor], kind: str) -> float:
        """The PUSH of one part ("conv" or "fc"): its N meshes' transfers on the
        bottleneck, and its compression at the edge and the server."""
        assert self.backhaul is not None
        parts = [s for s in self.segments if (s.kind == "conv") == (kind == "conv")]
        codec = VectorCodec(tuple(parts), tuple(plan[s.name] for s in parts))
        nbytes = HEADER_BYTES + ITEM_BYTES * PUSH_HEAD + codec.nbytes
        queued = self.meshes if self.shared else 1
        return queued * self.backhaul.message_s(nbytes) + \
            self.backhaul.cpu_s(codec.operations)

    def predict(self, choice: dict[str, str]) -> float:
        """Seconds of a step under `choice`: layer -> compressor spec, and
        ACTIVATIONS -> a forward format."""
        plan = {s.name: parse_compressor(choice.get(s.name, "none")) for s in self.segments}
        dense = {s.name: parse_compressor("none") for s in self.segments}
        fmt = choice.get(ACTIVATIONS, "float32")
        forward = self.forward_waves.get(fmt, self.dense_wave_s)
        hops = self.format_hops.get(fmt, self.critical_hops)
        wave = forward - hops * (self.reduce_hop_s(dense) - self.reduce_hop_s(plan, hops))
        summed = self.summed_spec(plan)
        if summed is not None and fmt in self.summed_waves.get(summed, {}):
            wave = self.summed_waves[summed][fmt]  # measured, as the formats' are
        if self.backhaul is None:
            return wave
        head, conv = self.push_s(plan, "fc"), self.push_s(plan, "conv")
        if not self.overlap:
            return wave + head + conv + self.return_s
        # The head's part goes as soon as its gradient exists, while the mesh still
        # computes the conv layers': only what outlasts that backward delays the step.
        return wave + max(0.0, head - self.head_lead_s) + conv + self.return_s


def option_table(segments: Sequence[Segment], candidates: Sequence[str],
                 gradients: dict[str, list[np.ndarray]], model: StepModel,
                 tree_factor: float = 1.0) -> list[Option]:
    """Every (layer, compressor) that applies, with its bytes, error and times. A conv
    layer's error is one compression's times `tree_factor` (`tree_error_factor`): the
    REDUCE is compressed again at every hop. Under intsum (`model.summed`) bytes and
    error are the measured ones: its payload shared among the conv layers as their
    values are, and the error that reached the edge."""
    rows = []
    conv_values = sum(s.size for s in segments if s.kind == "conv")
    for segment in segments:
        for spec in candidates:
            compressor = parse_compressor(spec)
            if not compressor.applies_to(segment):
                continue
            summed = model.summed.get(compressor.spec) if isinstance(compressor, IntSum) \
                else None
            if isinstance(compressor, IntSum) and summed is None:
                continue  # not measured: no figures to plan with
            nbytes = compressor.nbytes(segment) if summed is None else \
                round(summed.payload_bytes * segment.size / conv_values)
            if segment.kind == "conv":
                # On the critical path of the REDUCE, then (several meshes) the push;
                # intsum's sums are larger there than on average.
                hop = model.radio.message_s(nbytes if summed is None else round(
                    summed.critical_bytes(model.critical_hops) * segment.size / conv_values))
                communication = model.critical_hops * hop
                compression = model.critical_hops * model.radio.cpu_s(
                    compressor.operations(segment))
                overlapped = 0.0
            else:
                communication = 0.0 if model.backhaul is None else \
                    model.meshes ** model.shared * model.backhaul.message_s(nbytes)
                compression = 0.0 if model.backhaul is None else \
                    model.backhaul.cpu_s(compressor.operations(segment))
                hidden = model.head_lead_s if model.overlap else 0.0
                overlapped = min(communication + compression, hidden) \
                    if model.backhaul is not None else 0.0
            if summed is not None:
                error = summed.error[segment.name]
                compression = model.critical_hops * model.radio.cpu_s(
                    SumCodec((segment,), (compressor.levels,)).operations)
            else:
                error = relative_error(compressor, segment, gradients[segment.name])
                if segment.kind == "conv" and not compressor.lossless:
                    error *= tree_factor
            rows.append(Option(segment.name, spec, nbytes, error, compression,
                               communication, overlapped))
    return rows


def relative_error(compressor: Compressor, segment: Segment,
                   gradients: list[np.ndarray]) -> float:
    """Mean over the steps of ||g - decode(encode(g))|| / ||g|| (no error feedback)."""
    from meshdl.compress.compressors import ChannelState

    state = ChannelState(np.random.default_rng(0))
    errors = []
    for g in gradients:
        norm = float(np.linalg.norm(g))
        if norm == 0.0:
            continue
        decoded = compressor.compress(g, segment, state)[1]
        errors.append(float(np.linalg.norm(g - decoded)) / norm)
    return float(np.mean(errors)) if errors else 0.0


@dataclass(frozen=True)
class Plan:
    """A compressor per layer, with the model's predicted step time."""

    per_layer: dict[str, str]
    predicted_step_s: float

    @property
    def spec(self) -> str:
        """The plan as a --compress value."""
        return ",".join(f"{layer}={c}" for layer, c in self.per_layer.items())


def _plan(choice: dict[str, str], model: StepModel) -> Plan:
    return Plan(dict(choice), model.predict(choice))


def optimal_plan(options: Sequence[Option], model: StepModel, max_error: float) -> Plan:
    """The allowed plan of least predicted step time. Ties (a head's push the overlap
    hides costs the same time whatever it weighs) go to fewer bytes (less energy and
    backhaul load; the budget already bounds the error), then to the smaller total
    error, then to the earlier candidates."""
    allowed = _allowed(options, max_error)
    best: tuple[float, int, float, int] | None = None
    chosen: dict[str, str] = {}
    names = list(allowed)
    for rank, combo in enumerate(itertools.product(*(allowed[n] for n in names))):
        choice = {n: o.compressor for n, o in zip(names, combo, strict=True)}
        if not _whole_reduce(choice, model):
            continue
        key = (round(model.predict(choice), 9), sum(o.bytes for o in combo),
               sum(o.error for o in combo), rank)
        if best is None or key < best:
            best, chosen = key, choice
    return _plan(chosen, model)


def greedy_plan(options: Sequence[Option], model: StepModel, max_error: float) -> Plan:
    """Each class alone: the allowed option of least communication plus compression
    time for that class (ties, as in the optimum, to fewer bytes, then less error)."""
    allowed = _allowed(options, max_error)

    def best(ops: list[Option]) -> str:
        return min(ops, key=lambda o: (round(o.communication_s + o.compression_s, 9),
                                       o.bytes, o.error)).compressor

    choice = {name: best(ops) for name, ops in allowed.items()}
    if not _whole_reduce(choice, model):  # intsum for some conv layers: for none, then
        choice = {name: best([o for o in ops if not _is_summed(o.compressor)])
                  for name, ops in allowed.items()}
    return _plan(choice, model)


def _is_summed(spec: str) -> bool:
    return spec == "intsum" or spec.startswith("intsum:")


def _whole_reduce(choice: dict[str, str], model: StepModel) -> bool:
    """Is one intsum every conv layer's choice, or none's (the REDUCE is summed whole,
    and its bytes were measured for one level count on every layer)?"""
    conv = [choice.get(s.name, "none") for s in model.segments if s.kind == "conv"]
    summed = [_is_summed(spec) for spec in conv]
    return not any(summed) or (all(summed) and len(set(conv)) == 1)


def uniform_plans(candidates: Sequence[str], model: StepModel,
                  activations: bool = True) -> dict[str, Plan]:
    """Each compressor on every class it applies to, the others dense, as `--compress
    NAME` does (fp16 and int8 also carry the forward activations)."""
    plans = {}
    for spec in candidates:
        compressor = parse_compressor(spec)
        if isinstance(compressor, IntSum) and compressor.spec not in model.summed:
            continue
        choice = {s.name: spec if compressor.applies_to(s) else "none"
                  for s in model.segments}
        if activations:
            choice[ACTIVATIONS] = spec if spec in FORMATS else "float32"
        plans[spec] = _plan(choice, model)
    return plans


def _allowed(options: Sequence[Option], max_error: float) -> dict[str, list[Option]]:
    """The options within the error budget, per class in the table's order (dense and
    float32 always)."""
    allowed: dict[str, list[Option]] = {}
    for option in options:
        if option.compressor in ("none", "float32") or option.error <= max_error + 1e-12:
            allowed.setdefault(option.layer, []).append(option)
    return allowed


def calibrate_hops(dense_wave_s: float, other_wave_s: float, dense_hop_s: float,
                   other_hop_s: float) -> float:
    """REDUCE hops on the critical path, from two simulated waves that differ only in
    the REDUCE's size."""
    saved = dense_hop_s - other_hop_s
    if saved <= 0 or not math.isfinite(saved):
        return 0.0
    return max(0.0, (dense_wave_s - other_wave_s) / saved)


def tree_error_factor(subtree_sizes: Sequence[int]) -> float:
    """How much larger the error of a REDUCE compressed at every hop is at the edge than
    one compression of the whole sum: each node's message carries its subtree's sum, its
    compression error is about e times that (relative L2), the errors of the messages
    are independent and all reach the edge (a child's is in its parent's sum), so they
    add in quadrature: e sqrt(sum_i (s_i / N)^2) for subtree sizes s_i of N cells.
    Measured on the seed mesh: 2-bit compressed once costs 0.5 points of accuracy, at
    every hop of its 425 (factor 2.6) it does not learn."""
    n = max(subtree_sizes, default=0)  # the root's: every cell
    if n == 0:
        return 1.0
    return math.sqrt(sum((size / n) ** 2 for size in subtree_sizes))
