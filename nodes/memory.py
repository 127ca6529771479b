"""A node's memory plan for one wave (seed 002: a buffer whose values are dead is
overwritten rather than a new one allocated).

A wave's values live in one (slots, channels, batch) array per field (nodes/plan.py), each
a range of slots of the node's arena of its channel count (`MemoryPlan.arenas`,
`places`). The plan says which fields may share an array, and so alias the same slots,
from the order in which the wave writes and reads them:
  - An inference wave never touches a gradient field (dz, route, dpooled), nor under
    global pooling the winners: they get no memory. In the seed mesh that is half of a
    node's buffers.
  - In an exact training wave the gradients coming down the tree (dpooled) take the
    memory of the features that went up (pooled). A SCATTER comes only after the edge had
    every GATHER, so after this node sent its pooled values on, and nothing reads them
    again.
  - In an exact training wave a block's leader routes the pooled gradient to its
    members over their last activations, which it read when it pooled, and a node
    between them relays routed gradients over what it relayed the other way (a node's
    own last activation is kept apart first: the ReLU mask of dz_top).
  - In an exact training wave, above the first layer, the output gradients around a
    cell (dz of layer l) take the memory of the activations around it (a of layer l-1).
    Every dz value comes after the edge ran the head, so after this node's conv l read
    its window and sent on what it relays. What the backward pass still needs of that
    window is the cell's own activation (the ReLU mask, and the weight gradient): it is
    kept apart when conv l-1 makes it, and the layer's weight gradient is taken from it
    and the dz window: the same sum as output gradient times input window, split over
    the mesh by input cell instead of by output cell (`compute.weight_grad_of_input`).
    For layer 1, the input gradient of layer 2 then overwrites that kept activation
    once the weight gradient has read it: seed 002's "schedule the weight-gradient and
    input-gradient computations".
Sharing rests on the protocol's order: in an honest wave no gradient reaches a node
before its forward pass is over. A reordered or forged message may, so a wave that
shares holds the gradients that come early, and the backward tasks ready early (a cell
no routed gradient reaches), until its forward tasks are done (nodes/agent.py): whatever
the order of arrival, a node computes the same.
Best effort shares nothing: there the edge may go on without a subtree whose GATHER can
still come in after the SCATTER, and a node's forward pass may end at its deadlines,
after gradients came. Every node of a mesh takes its weight gradients the same way
(both ways split the same sum; mixing them would count terms twice, hence protocol
version 3): by input cell in every training wave under the plan. In best effort that
differs in one respect from the output-cell way: a missing neighbour's filled-in
activation no longer adds its term, and a lost output gradient drops the term it
carried.
"""

from __future__ import annotations

from typing import NamedTuple

from meshdl.protocol.spec import Field, Mode

GRADIENTS = ("dz", "route", "dpooled")  # fields filled with zeros whatever the policy
TRAINING = (*GRADIENTS, "winner")  # fields only a training wave touches


class MemoryPlan(NamedTuple):
    """Which arrays a wave allocates, and which of them each field uses: laid out as
    slot ranges of a node's arenas (one per channel count), so that sharing is slot
    aliasing, two fields on the same slots of one arena."""

    arrays: tuple[tuple[int, int], ...]  # (slots, channels) of each array allocated
    fields: tuple[int | None, ...]  # per field buffer: its array; None: never touched
    kept: tuple[int | None, ...]  # per conv layer: the array keeping this cell's a, or None
    # Weight gradients above the first layer from this cell's input and the output
    # gradients around it (`compute.weight_grad_of_input`): every training wave under
    # the plan, exact or not, so that all nodes of a mesh split the sum alike.
    by_input_cell: bool = False
    later: tuple[int, ...] = ()  # the gradient fields written over another field's values

    @property
    def arenas(self) -> tuple[tuple[int, int], ...]:
        """(slots, channels) of each arena a node allocates for a wave: one per channel
        count (the input's, the filters'), its arrays end to end (`places`)."""
        slots: dict[int, int] = {}
        for rows, channels in self.arrays:
            slots[channels] = slots.get(channels, 0) + rows
        return tuple((rows, channels) for channels, rows in slots.items())

    @property
    def places(self) -> tuple[tuple[int, int], ...]:
        """(arena, first slot) of each array: a field's slots are those of its array,
        so fields that share an array alias the same slots of one arena."""
        arena = {channels: k for k, (_, channels) in enumerate(self.arenas)}
        filled = [0] * len(arena)
        places = []
        for rows, channels in self.arrays:
            k = arena[channels]
            places.append((k, filled[k]))
            filled[k] += rows
        return tuple(places)

    @property
    def shares(self) -> bool:
        """Some field's memory is written over values of another one: the wave holds
        gradients that come before this node's forward pass is over (a reordered or
        forged message), which would overwrite what it still reads."""
        return len(set(self.fields) - {None}) < sum(f is not None for f in self.fields)


def unplanned(shapes: list[tuple[int, int]], layers: int) -> MemoryPlan:
    """Every field its own array in every wave, weight gradients by output cell: as
    before the plan (only to measure what it saves)."""
    return MemoryPlan(tuple(shapes), tuple(range(len(shapes))), (None,) * (layers + 1))


def plan_memory(buffers: dict[Field, int], shapes: list[tuple[int, int]], mode: Mode,
                exact: bool, layers: int) -> MemoryPlan:
    """The plan of a wave of `mode` (see the module's docstring) for a node whose field
    buffers are `buffers` (field -> index) of `shapes` (slots, channels)."""
    arrays = list(shapes)
    fields: list[int | None] = list(range(len(shapes)))
    kept: list[int | None] = [None] * (layers + 1)
    if mode == Mode.INFER:
        for f, index in buffers.items():
            if f[0] in TRAINING:
                fields[index] = None
        return _allocated(arrays, fields, kept, by_input_cell=False, later=())
    if exact:
        _share(buffers, shapes, layers, arrays, fields, kept)
    later = tuple(index for f, index in buffers.items() if f[0] in GRADIENTS and
                  fields[index] != index)
    return _allocated(arrays, fields, kept, by_input_cell=layers >= 2, later=later)


def _share(buffers: dict[Field, int], shapes: list[tuple[int, int]], layers: int,
           arrays: list[tuple[int, int]], fields: list[int | None],
           kept: list[int | None]) -> None:
    """An exact training wave's sharing (the module's rules), in `fields` and `kept`;
    kept activations get arrays of their own, appended to `arrays`."""
    # Not under global pooling: there the SCATTER may come before the tie-breaking
    # (`Step.WINNERS`) has read the subtree maxima, which the edge does not wait for.
    if ("pooled",) in buffers and ("dpooled",) in buffers and ("winner",) not in buffers:
        pooled, dpooled = buffers[("pooled",)], buffers[("dpooled",)]
        if shapes[pooled] == shapes[dpooled]:  # the same blocks: those of the subtree
            fields[dpooled] = pooled
    for layer in range(2, layers + 1):
        below, dz = buffers.get(("a", layer - 1)), buffers.get(("dz", layer))
        if below is not None and dz is not None and shapes[dz] == shapes[below]:
            kept[layer - 1] = len(arrays)  # (the window's cells, mirrored: same count)
            arrays.append((1, shapes[below][1]))
            fields[dz] = below
    top, route = buffers.get(("a", layers)), buffers.get(("route",))
    if top is not None and route is not None and shapes[route] == shapes[top] and \
            shapes[top][0] > 1:  # a block's leader, or a relay between it and a member
        kept[layers] = len(arrays)
        arrays.append((1, shapes[top][1]))
        fields[route] = top
    first = buffers.get(("dz", 1))
    if layers >= 2 and kept[1] is not None and first is not None and \
            shapes[first] == arrays[kept[1]]:
        fields[first] = kept[1]  # dz_1 written over a_1, its mask (`compute.input_grad`)


def _allocated(arrays: list[tuple[int, int]], fields: list[int | None],
               kept: list[int | None], by_input_cell: bool,
               later: tuple[int, ...]) -> MemoryPlan:
    """The plan with only the arrays some field or kept activation uses, renumbered."""
    used = sorted({i for i in fields if i is not None} | {k for k in kept if k is not None})
    renumber = {old: new for new, old in enumerate(used)}
    return MemoryPlan(tuple(arrays[i] for i in used),
                      tuple(None if i is None else renumber[i] for i in fields),
                      tuple(None if k is None else renumber[k] for k in kept), by_input_cell,
                      later)
