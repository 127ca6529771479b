"""Counting what the mesh sends: values, messages, bytes and links, per message class.

Two media are counted side by side for every message sent:
- unicast: one delivery per receiver, as through an MQTT broker;
- broadcast: one radio transmission heard by every one-hop neighbour, so the messages a
  node sends in the same wave, of the same kind, layer and phase, go out once, carrying
  the union of their items.
All links are one hop, so a message is one hop transmission. Bytes include the header
and, when the mesh authenticates its messages, each one's tag or signature. Two header
encodings are counted: `bytes` with the mesh's own (`MeshSpec.header`: the 48-byte
header of messages.py unless it says otherwise), `compact_bytes` with the 8-byte header
a radio stack sends beside its MAC frame (meshdl/protocol/compact.py), for the same
messages and transmissions.
The analytical side: per conv layer and per sample, `needed` is what nodes must obtain
(their window inside the grid minus their own cell, times input channels), next to the
seed paper's formula (k^2 - 1) * m * n * c_in, which assumes every cell has a full
window. The border is why the needed count is lower: a window reaching outside the grid
reads zeros, which nobody sends.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from operator import attrgetter
from typing import Any

from meshdl.protocol.messages import ALL, CLASS_OF, DTYPES, Header, Kind, Message
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topics import name_of
from meshdl.protocol.topology import Cell

_LAYERED = (Kind.HALO, Kind.GRAD_HALO)
# A header's (step, (src, dst, kind, layer, phase, shape, dtype)): its wave, and what
# it costs.
_STEP = attrgetter("step")
_COST_KEY = attrgetter("src", "dst", "kind", "layer", "phase", "shape", "dtype")


def class_name(kind: Kind, layer: int) -> str:
    """Accounting class: halo and grad-halo are split per conv layer."""
    return f"{CLASS_OF[kind]}/conv{layer}" if kind in _LAYERED else CLASS_OF[kind]


def needed_halo_values(spec: MeshSpec, layer: int) -> int:
    """Per sample: values all nodes must obtain for conv `layer`'s windows."""
    before, after = spec.offsets
    cells = sum(len(spec.topology.window(c, before, after)) - 1 for c in spec.topology.cells())
    return cells * spec.channels(layer - 1)


def formula_halo_values(spec: MeshSpec, layer: int) -> int:
    """The seed paper's (k^2 - 1) * m * n * c_in for one convolution."""
    m = spec.model
    return (m.kernel**2 - 1) * m.rows * m.cols * spec.channels(layer - 1)


def message_items(spec: MeshSpec, src: Cell, dst: Cell, kind: Kind, layer: int,
                  phase: int) -> tuple:
    """The items a message carries, so that a radio broadcast carries each once."""
    send = spec.expects.get(dst, {}).get((kind, layer, phase, src))
    if send is not None:
        return send.items
    if kind == Kind.REDUCE:
        return (("reduce", dst),)  # one parent: never shared
    return (("same-for-all", kind),)  # PARAMS, BATCH: one content per wave


class Ledger:
    """Accumulates counts of every message sent in a mesh run.

    `record` is on the hot path of every wave, so it only keeps the header. `tally`
    (called by the transport after each wave, and by `report`) reduces each wave to the
    list of what its messages cost (sender, receiver, kind, layer, phase, shape), in
    C-level loops. Successive waves of a run mostly send exactly the same messages (in
    the same order in the virtual mesh, in an order of their own under simulated time,
    where backoffs reorder them), so a wave that sends what the one before sent only
    adds to a repeat count, and only a different wave is counted message by message.
    `report` turns the counts into values, bytes and links, and the broadcast figures of
    each distinct wave.
    """

    def __init__(self, spec: MeshSpec) -> None:
        self.spec = spec
        self.waves = 0
        self._headers: list[Header] = []  # recorded since the last tally
        self._step = -1  # of the wave being counted ...
        self._wave: list[tuple] = []  # ... and its messages' cost keys
        self._last: list[tuple] = []  # the last finished wave ...
        self._last_sent: Counter[tuple] | None = None  # ... as a multiset (when needed)
        self._repeats = 0  # ... and how many waves in a row sent exactly that
        # Each distinct wave (its multiset of cost keys) -> [that multiset, times sent]:
        # runs alternate between a few kinds of wave (training, evaluation batches),
        # and a wave's thousands of keys are multiplied out once, in `_totals`.
        self._distinct: dict[frozenset, list] = {}
        self._broadcast_of: dict[frozenset[tuple], Counter[tuple[str, str]]] = {}

    def record(self, message: Message) -> None:
        """Note one message at the moment it is sent (`tally` counts it)."""
        self._headers.append(message.header)

    def record_all(self, messages: list[Message]) -> None:
        """Note several messages sent at once (one party's answer to one message)."""
        self._headers.extend([message.header for message in messages])

    def record_wave(self, step: int, keys: list[tuple]) -> None:
        """Note what the nodes of a compiled wave (sim/compiled.py) sent one another, as
        the cost keys `tally` makes of headers, after the wave's messages to and from
        the edge, which are recorded as messages."""
        self.tally()
        if step != self._step:
            self._end_wave()
            self._step = step
            self.waves += 1
        self._wave.extend(keys)

    def tally(self) -> None:
        """Count the headers recorded since the last tally, wave (step number) by wave."""
        headers, self._headers = self._headers, []
        steps = dict.fromkeys(map(_STEP, headers))  # in order of first appearance
        for step in steps:
            group = headers if len(steps) == 1 else [h for h in headers if h.step == step]
            if step != self._step:  # else the tail of the wave counted last time
                self._end_wave()
                self._step = step
                self.waves += 1
            self._wave.extend(map(_COST_KEY, group))

    def _end_wave(self) -> None:
        if not self._wave:
            return
        sent = None
        if self._wave == self._last:
            self._repeats += 1
        elif len(self._wave) == len(self._last) and \
                dict.__eq__(sent := Counter(self._wave), self._last_counted()):
            self._repeats += 1  # the same messages in an order of their own
        else:
            self._fold()
            self._last, self._last_sent, self._repeats = self._wave, sent, 1
        self._wave = []

    def _last_counted(self) -> Counter[tuple]:
        """The last wave as a multiset (counted in C; compared as a plain dict, since
        Counter's own == is a Python loop)."""
        if self._last_sent is None:
            self._last_sent = Counter(self._last)
        return self._last_sent

    def _fold(self) -> None:
        """Count the last wave, times its repeats, among the distinct waves."""
        if not self._repeats:
            return
        sent = self._last_counted()
        entry = self._distinct.setdefault(frozenset(sent.items()), [sent, 0])
        entry[1] += self._repeats
        self._last, self._last_sent, self._repeats = [], None, 0

    def _totals(self) -> tuple[Counter[tuple], Counter[tuple[str, str]]]:
        """Every distinct message with the times it was sent, and the broadcast figures
        ((class, figure) -> sum), over the waves folded so far."""
        totals: Counter[tuple] = Counter()
        broadcast: Counter[tuple[str, str]] = Counter()
        for sent, repeats in self._distinct.values():
            for key, times in sent.items():
                totals[key] += times * repeats
            wave = frozenset(sent)
            figures = self._broadcast_of.get(wave)
            if figures is None:
                figures = self._broadcast_of[wave] = self._broadcast_figures(wave)
            for key, value in figures.items():
                broadcast[key] += value * repeats
        return totals, broadcast

    def _broadcast_figures(self, wave: frozenset[tuple]) -> Counter[tuple[str, str]]:
        """One wave by radio: a sender's messages of one kind, layer and phase share one
        transmission, carrying the union of their items."""
        groups: dict[tuple, tuple[str, set, int, Kind]] = {}
        for src, dst, kind, layer, phase, shape, dtype in wave:
            items = message_items(self.spec, src, dst, kind, layer, phase)
            per_item = math.prod(shape) // len(items)
            group = groups.setdefault((src, kind, layer, phase),
                                      (class_name(kind, layer), set(), per_item, kind, dtype))
            group[1].update(items)
        figures: Counter[tuple[str, str]] = Counter()
        for name, items, per_item, kind, dtype in groups.values():
            values = len(items) * per_item
            figures[name, "transmissions"] += 1
            figures[name, "values"] += values
            figures[name, "bytes"] += self.spec.overhead(kind) + \
                DTYPES[dtype].itemsize * values
            figures[name, "compact_bytes"] += self.spec.overhead(kind, "compact") + \
                DTYPES[dtype].itemsize * values
        return figures

    def sent_by(self, kind: Kind) -> dict[Cell, tuple[int, int]]:
        """Bytes and messages of one kind each party has sent so far: the per-sender
        view the report leaves out (`meshdl schedule` weighs intsum's REDUCE, whose size
        grows towards the root, along the tree)."""
        self.tally()
        self._end_wave()
        self._fold()
        out: dict[Cell, tuple[int, int]] = {}
        for (src, _, k, _, _, shape, dtype), sent in self._totals()[0].items():
            if k == kind:
                size = self.spec.overhead(kind) + DTYPES[dtype].itemsize * math.prod(shape)
                nbytes, messages = out.get(src, (0, 0))
                out[src] = (nbytes + size * sent, messages + sent)
        return out

    def report(self) -> dict[str, Any]:
        """The "comm" record of metrics.json (wave timing is added by the transport)."""
        self.tally()
        self._end_wave()
        self._fold()
        unicast: dict[str, Counter[str]] = defaultdict(Counter)
        links: Counter[tuple[str, str]] = Counter()
        link_messages: Counter[tuple[str, str]] = Counter()
        halo_values: Counter[int] = Counter()  # layer -> values per sample, summed
        cells = self.spec.model.rows * self.spec.model.cols
        totals, broadcast_sums = self._totals()
        for (src, dst, kind, layer, _, shape, dtype), sent in totals.items():
            values = math.prod(shape)  # of a compressed payload: its bytes
            size = self.spec.overhead(kind) + DTYPES[dtype].itemsize * values  # tags too
            compact = size - self.spec.overhead(kind) + self.spec.overhead(kind, "compact")
            count = sent * cells if dst == ALL else sent  # a broker delivers to every node
            counts = unicast[class_name(kind, layer)]
            counts["values"] += values * count
            counts["messages"] += count
            counts["bytes"] += size * count
            counts["compact_bytes"] += compact * count
            # A broadcast crosses the edge's own link once; the broker fans it out.
            link = (name_of(src), name_of(dst))
            links[link] += size * sent
            link_messages[link] += sent
            if kind == Kind.HALO:
                halo_values[layer] += values // shape[-1] * count
        classes = {}
        for name in sorted(unicast):
            broadcast = {figure: n for (cls, figure), n in sorted(broadcast_sums.items())
                         if cls == name}
            classes[name] = {**unicast[name], "broadcast": broadcast}
        # Ties go to the first link by name, not to whichever was counted first.
        busiest = max(sorted(links), key=links.__getitem__, default=None)
        halo = {}
        for layer in range(1, self.spec.model.conv_layers + 1):
            halo[f"conv{layer}"] = {
                "needed": needed_halo_values(self.spec, layer),
                "transmitted": halo_values[layer] / max(self.waves, 1),
                "formula": formula_halo_values(self.spec, layer),
            }
        total_messages = sum(c["messages"] for c in unicast.values())
        return {
            "classes": classes,
            "halo": halo,
            "total_bytes": sum(c["bytes"] for c in unicast.values()),
            "total_messages": total_messages,
            "hop_transmissions": total_messages,
            "broadcast_transmissions": sum(n for (_, f), n in broadcast_sums.items()
                                           if f == "transmissions"),
            "broadcast_bytes": sum(n for (_, f), n in broadcast_sums.items() if f == "bytes"),
            "total_compact_bytes": sum(c["compact_bytes"] for c in unicast.values()),
            "broadcast_compact_bytes": sum(n for (_, f), n in broadcast_sums.items()
                                           if f == "compact_bytes"),
            "busiest_link": None if busiest is None else {
                "link": f"{busiest[0]}->{busiest[1]}", "bytes": links[busiest],
                "messages": link_messages[busiest]},
            "waves": self.waves,
        }
