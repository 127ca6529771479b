"""The parts of the model a PUSH or WEIGHTS carries (its header's `layer` field).

Without overlap a message carries every parameter (`WHOLE`). With the layer-wise
overlap of seed 002 a step's gradient goes up in two parts, the head's as soon as the
edge has computed it (while the conv backward still runs in the mesh), the conv
layers' when the REDUCE comes; the weights come back conv layers first, which the
next wave's PARAMS need at once, then the head's, which the edge needs only when the
wave's pooled features arrive.
"""

from __future__ import annotations

from enum import IntEnum

from meshdl.compress.codec import VectorCodec
from meshdl.compress.policy import CompressionPolicy, model_segments
from meshdl.config import ModelConfig
from meshdl.protocol.payloads import ParamsLayout


class Part(IntEnum):
    WHOLE = 0  # every parameter, in the model's flat order
    CONV = 1  # the conv layers' (what PARAMS floods into the mesh)
    HEAD = 2  # the fully-connected head's (what the edge runs)


_BY_VALUE = {part.value: part for part in Part}
SPLIT = (Part.CONV, Part.HEAD)  # a step's parts with overlap, in the order weights go


def part_slice(part: Part, model: ModelConfig) -> slice:
    """Where `part` sits in the model's flat parameter vector."""
    conv = ParamsLayout.of(model).conv_size
    return {Part.WHOLE: slice(0, None), Part.CONV: slice(0, conv),
            Part.HEAD: slice(conv, None)}[part]


def part_of(layer: int) -> Part | None:
    """The part a header's `layer` names, or None."""
    return _BY_VALUE.get(layer)


def part_codecs(compress: str, model: ModelConfig) -> dict[Part, VectorCodec] | None:
    """How each part's gradient is compressed in a PUSH under the `--compress` policy;
    None: PUSH carries plain float32."""
    policy = CompressionPolicy.parse(compress, model)
    segments = model_segments(model)
    codecs = {Part.WHOLE: policy.codec(segments),
              Part.CONV: policy.codec(tuple(s for s in segments if s.kind == "conv")),
              Part.HEAD: policy.codec(tuple(s for s in segments if s.kind != "conv"))}
    return None if codecs[Part.WHOLE].lossless else codecs
