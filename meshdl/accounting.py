"""Counting what the mesh sends: values, messages, bytes and links, per message class.

Two media are counted side by side for every message sent:
- unicast: one delivery per receiver, as through an MQTT broker;
- broadcast: one radio transmission heard by every one-hop neighbour, so the messages a
  node sends in the same wave, of the same kind, layer and phase, go out once, carrying
  the union of their items.
All links are one hop, so a message is one hop transmission.
The analytical side: per conv layer and per sample, `needed` is what nodes must obtain
(their window inside the grid minus their own cell, times input channels), next to the
seed paper's formula (k^2 - 1) * m * n * c_in, which assumes every cell has a full
window. The border is why the needed count is lower: a window reaching outside the grid
reads zeros, which nobody sends.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from meshdl.messages import CLASS_OF, HEADER_BYTES, Header, Kind, Message
from meshdl.protocol import MeshSpec
from meshdl.topics import name_of

_LAYERED = (Kind.HALO, Kind.GRAD_HALO)


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


class Ledger:
    """Accumulates counts of every message sent in a mesh run."""

    def __init__(self, spec: MeshSpec) -> None:
        self.spec = spec
        self.unicast: dict[str, Counter[str]] = defaultdict(Counter)
        self.broadcast: dict[str, Counter[str]] = defaultdict(Counter)
        self.links: Counter[tuple[str, str]] = Counter()
        self.link_messages: Counter[tuple[str, str]] = Counter()
        self.halo_values: Counter[int] = Counter()  # layer -> values per sample, summed
        self.waves = 0
        self._groups: dict[tuple, list] = {}  # this wave's broadcast transmissions
        self._static: dict[tuple, tuple[str, tuple[str, str], tuple]] = {}
        self._step = -1

    def record(self, message: Message) -> None:
        """Count one message at the moment it is sent."""
        h = message.header
        if h.step != self._step:
            self._flush()
            self._step = h.step
            self.waves += 1
        key = (h.src, h.dst, h.kind, h.layer, h.phase)
        static = self._static.get(key)
        if static is None:
            static = self._static[key] = self._describe(h)
        name, link, items = static
        values, size = message.payload.size, HEADER_BYTES + message.payload.nbytes
        counts = self.unicast[name]
        counts["values"] += values
        counts["messages"] += 1
        counts["bytes"] += size
        self.links[link] += size
        self.link_messages[link] += 1
        if h.kind == Kind.HALO:
            self.halo_values[h.layer] += values // message.payload.shape[-1]
        # Broadcast: same sender, wave, kind, layer and phase share one transmission.
        group_key = (h.src, h.kind, h.layer, h.phase)
        group = self._groups.get(group_key)
        if group is None:
            self._groups[group_key] = [name, set(items), values // len(items)]
        else:
            group[1].update(items)

    def _describe(self, h: Header) -> tuple[str, tuple[str, str], tuple]:
        """Class, link and carried items of a (src, dst, kind, layer, phase) message."""
        send = self.spec.expects.get(h.dst, {}).get((h.kind, h.layer, h.phase, h.src))
        if send is not None:
            items = send.items
        elif h.kind == Kind.REDUCE:
            items = (("reduce", h.dst),)  # one parent: never shared
        else:
            items = (("same-for-all", h.kind),)  # PARAMS, BATCH: one content per wave
        return class_name(h.kind, h.layer), (name_of(h.src), name_of(h.dst)), items

    def _flush(self) -> None:
        for name, items, per_item in self._groups.values():
            counts = self.broadcast[name]
            values = len(items) * per_item
            counts["transmissions"] += 1
            counts["values"] += values
            counts["bytes"] += HEADER_BYTES + 4 * values
        self._groups.clear()

    def report(self) -> dict[str, Any]:
        """The "comm" record of metrics.json (wave timing is added by the transport)."""
        self._flush()
        classes = {}
        for name in sorted(self.unicast):
            classes[name] = {**self.unicast[name], "broadcast": dict(self.broadcast[name])}
        busiest = max(self.links, key=self.links.__getitem__, default=None)
        halo = {}
        for layer in range(1, self.spec.model.conv_layers + 1):
            halo[f"conv{layer}"] = {
                "needed": needed_halo_values(self.spec, layer),
                "transmitted": self.halo_values[layer] / max(self.waves, 1),
                "formula": formula_halo_values(self.spec, layer),
            }
        return {
            "classes": classes,
            "halo": halo,
            "total_bytes": sum(c["bytes"] for c in self.unicast.values()),
            "total_messages": sum(c["messages"] for c in self.unicast.values()),
            "hop_transmissions": sum(c["messages"] for c in self.unicast.values()),
            "broadcast_transmissions": sum(c["transmissions"] for c in self.broadcast.values()),
            "broadcast_bytes": sum(c["bytes"] for c in self.broadcast.values()),
            "busiest_link": None if busiest is None else {
                "link": f"{busiest[0]}->{busiest[1]}", "bytes": self.links[busiest],
                "messages": self.link_messages[busiest]},
            "waves": self.waves,
        }
