"""Which compressor each layer's gradient gets: the `--compress` policy, read once.

    none                   every message as float32 (the exact wire format)
    NAME[:ARG]             that compressor on every layer it applies to (kernel top-k
                           only applies to conv layers; the others stay dense)
    hylo[:T[:c]]           Hylo (seed 003): layers of more than T parameters compressed
                           by type, the rest dense. A conv layer sends the kernels of
                           largest norm, T values' worth of them (its ratio adapted to
                           its size: max(1, floor(T x kernels / parameters)) kernels),
                           an fc layer every value in 2 bits with the adaptive
                           threshold, tau = c x mean |x| (`2bitmean:c`). c defaults to
                           2, chosen on a validation split (c = 1 lost 1.2 points
                           there, 2 lost 0.3, 3 left a seed at the one-class model;
                           docs/compression.md). T defaults to 64 (measured: at 16, one kernel
                           of conv2's 25, seed 1 of the seed experiment stayed at the
                           one-class model; docs/compression.md). Hylo's rule is for a
                           worker's gradient on its way to the server: an edge's PUSH.
                           Inside the mesh the conv layers are summed as whole numbers
                           (intsum, 7 levels a share where Hylo compresses the layer,
                           127 where it keeps it dense): kernel top-k applied again at
                           each of the tree's hops multiplies its error (-1.7 points
                           on the seed mesh; docs/compression.md). The per-hop form
                           is the explicit LAYER=ktopk:D,...,LAYER=2bit
    LAYER=NAME[:ARG],...   one compressor per layer (what `meshdl schedule` prints for
                           its plans), unnamed layers dense
    plan                   the optimal plan of `meshdl schedule` for the run's radio,
                           found before the run starts (sim/studies/schedule.py) and written
                           into its configuration as LAYER=NAME,...

A policy applies where gradients travel: the in-mesh REDUCE (the conv layers, summed up
the tree, re-compressed at every hop with that node's error feedback, or under intsum
summed as whole numbers: meshdl/compress/intsum.py) and the PUSH from each mesh's edge
to the parameter server (every layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from meshdl.compress.codec import VectorCodec
from meshdl.compress.compressors import (
    Compressor,
    Dense,
    IntSum,
    KernelTopK,
    MeanTwoBit,
    Segment,
    compressor_of,
)
from meshdl.compress.intsum import SumCodec
from meshdl.compress_grammar import (
    HYLO_FACTOR,
    HYLO_THRESHOLD,
    INTSUM_LEVELS,
    INTSUM_MAX_LEVELS,
    hylo_args,
    parse_policy,
)
from meshdl.config import ModelConfig, param_shapes


def model_segments(model: ModelConfig) -> tuple[Segment, ...]:
    """The model's layers in the flat vector's order: conv1, ..., fc1, fc2."""
    shapes = param_shapes(model)
    names = [name.removesuffix(".weight") for name in shapes if name.endswith(".weight")]
    return tuple(Segment(name, "conv" if name.startswith("conv") else "fc",
                         shapes[f"{name}.weight"], shapes[f"{name}.bias"][0])
                 for name in names)


@dataclass(frozen=True)
class CompressionPolicy:
    """A `--compress` value, parsed: a compressor for each layer of a model."""

    spec: str
    by_layer: tuple[tuple[str, Compressor], ...]  # layer name -> its compressor
    # Conv layers the REDUCE sums in the network (intsum), with each share's levels;
    # empty: the REDUCE is compressed at every hop by `by_layer`'s compressors.
    summed: tuple[tuple[str, int], ...] = ()

    @classmethod
    def parse(cls, spec: str, model: ModelConfig) -> CompressionPolicy:
        """`spec` over `model`'s layers; a UsageError (compress_grammar.py's) if impossible."""
        spec = spec.strip()
        segments = model_segments(model)
        choices = parse_policy(spec, segments)
        if choices is None:  # hylo[:T[:c]]
            threshold, factor = hylo_args(spec)
            chosen = hylo(segments, threshold, factor)
            summed = tuple((s.name, INTSUM_LEVELS if s.name in chosen else INTSUM_MAX_LEVELS)
                           for s in segments if s.kind == "conv")
            by_layer = tuple((s.name, chosen.get(s.name) or Dense()) for s in segments)
            return cls(spec, by_layer, summed if any(s.name in chosen for s in segments
                                                      if s.kind == "conv") else ())
        chosen = {name: compressor_of(choice) for name, choice in choices.items()}
        by_layer = tuple((s.name, chosen.get(s.name) or Dense()) for s in segments)
        return cls(spec or "none", by_layer,
                   tuple((s.name, c.levels) for s in segments
                         if isinstance(c := chosen.get(s.name), IntSum)))

    @property
    def active(self) -> bool:
        """Is any gradient compressed (else messages keep the float32 wire format)?"""
        return bool(self.summed) or any(not c.lossless for _, c in self.by_layer)

    def codec(self, segments: tuple[Segment, ...]) -> VectorCodec:
        table = dict(self.by_layer)
        return VectorCodec(segments, tuple(table[s.name] for s in segments))

    def sum_codec(self, segments: tuple[Segment, ...]) -> SumCodec | None:
        """The in-network sum of `segments` (the REDUCE's) if they are summed."""
        levels = dict(self.summed)
        if not segments or not all(s.name in levels for s in segments):
            return None
        return SumCodec(segments, tuple(levels[s.name] for s in segments))

    @cached_property
    def describe_reduce(self) -> dict[str, str]:
        """Conv layer -> how the REDUCE carries it (intsum:L, or the per-hop spec)."""
        levels = dict(self.summed)
        return {name: f"intsum:{levels[name]}" if name in levels else c.spec
                for name, c in self.by_layer if name.startswith("conv")}  # model_segments

    @cached_property
    def describe(self) -> dict[str, str]:
        """Layer -> compressor spec, for metrics and status records."""
        return {name: c.spec for name, c in self.by_layer}


def hylo(segments: tuple[Segment, ...], threshold: int = HYLO_THRESHOLD,
         factor: float = HYLO_FACTOR) -> dict[str, Compressor]:
    """Hylo's rule: above `threshold` parameters, conv layers by kernel top-k (about
    `threshold` values' worth of kernels: a ratio adapted to the layer's size), fc
    layers by 2-bit with the adaptive threshold, `factor` x mean |x|."""
    fc_rule = MeanTwoBit(factor)
    return {s.name: KernelTopK(max(1, threshold * s.kernels // s.size) / s.kernels)
            if s.kind == "conv" else fc_rule
            for s in segments if s.size > threshold}


def reduce_segments(model: ModelConfig) -> tuple[Segment, ...]:
    """What a REDUCE carries: the conv layers."""
    return tuple(s for s in model_segments(model) if s.kind == "conv")
