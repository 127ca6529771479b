"""A node host's repairs under authentication: the signature they carry, the sessions
they may come from.

A cell keeps the first PARAMS of a run of live slots and counts the edge's resends of
slots it began on its own as duplicates; its repairs send those cached parameters, with
the edge's signature of that version, however many resends came since. And a cell takes
no repair of an edge session older than the newest it has seen: a neighbour's login
may replay an earlier edge run's parameters, which still verify.
"""

from __future__ import annotations

import asyncio

import numpy as np

from meshdl.edge.agent import EdgeMachine
from meshdl.nodes.host import NodeHost
from meshdl.nodes.live import LiveSampler, SlotStarter, live_ring
from meshdl.nodes.serve import host_spec, pinning
from meshdl.protocol.auth import Authenticator, MeshKeys
from meshdl.protocol.messages import EDGE, Kind, Message, make
from meshdl.protocol.payloads import REPAIR
from meshdl.protocol.spec import LIVE_SLOTS, Mode, Split
from meshdl.protocol.topics import TopicNames
from tests.test_live_scheduled import BOTTOM, FIRST, SLOT_S, TOP, Series, _config, _model

CELLS = TOP + BOTTOM
KEYS = MeshKeys.from_seed(11)


class _Site:
    """One authenticating node host of every cell and an edge, in process: what the edge
    sends is sealed with its keys and opened with the host's, as over the broker."""

    def __init__(self) -> None:
        config = _config()
        config = config.model_copy(update={"mesh": config.mesh.model_copy(
            update={"auth": True})})
        self.spec = spec = host_spec(config)
        self.topics = TopicNames(spec.mesh_id)
        self.now = 0.0
        self.host = NodeHost(spec, CELLS, lambda _cell: {Split.LIVE: live_ring()})
        self.sampler = LiveSampler(self.host.nodes, {c: Series(c) for c in CELLS}, SLOT_S,
                                   clock=lambda: self.now)
        self.starter = SlotStarter(self.host, self.sampler)
        self.auth = Authenticator(KEYS.keyring(spec, CELLS))
        self.handle = pinning(self.host, self.auth)
        self.edge_auth = Authenticator(KEYS.keyring(spec, [EDGE]))

    def edge(self, session: int) -> EdgeMachine:
        return EdgeMachine(self.spec, _model(), {}, session=session)

    def sample(self, slot: int) -> None:
        self.now = slot * SLOT_S
        asyncio.run(self.sampler.sample(slot))

    def flood(self, edge: EdgeMachine, slot: int) -> np.ndarray:
        """The edge's PARAMS and BATCH of `slot`, through both sides' keys; returns the
        parameters they carried."""
        sent = edge.start(Mode.INFER, Split.LIVE, np.array([slot % LIVE_SLOTS]), step=slot)
        for message in sent:
            self.deliver(edge, message)
        return next(m.payload for m in sent if m.header.kind == Kind.PARAMS)

    def deliver(self, edge: EdgeMachine, message: Message) -> None:
        opened = self.auth.open(self.edge_auth.seal(message))
        for reply in self.handle(self.topics.of(opened.header), opened):
            if reply.header.dst == EDGE:
                edge.handle(reply)

    def begin(self, edge: EdgeMachine) -> None:
        """Halfway through the slot the host starts it by its clock."""
        self.now = (int(self.now // SLOT_S) + 0.5) * SLOT_S
        for message in self.starter.begin():
            if message.header.dst == EDGE:
                edge.handle(message)


def test_a_repair_carries_the_cached_versions_signature_after_the_edge_resent_four_slots(
        ) -> None:
    """The node host's authenticator kept the newest four waves' signatures only: four
    resends of slots its cells began on their own dropped the one of the parameters
    they cached, and the next repair raised out of the host's send (the host died)."""
    site = _Site()
    edge = site.edge(session=5)
    site.sample(FIRST)
    site.flood(edge, FIRST)
    for slot in range(FIRST + 1, FIRST + 5):
        site.sample(slot)
        edge.start_slot(slot)
        site.begin(edge)
        site.flood(edge, slot)  # resent: a duplicate for every cell, which keeps FIRST
    parent, child = (1, 0), (2, 0)
    node = site.host.nodes[parent]
    assert node.cached is not None and node.cached.step == FIRST
    assert node.stats["duplicates"] == 2 * 4  # each resend's PARAMS and BATCH
    [repair] = node._repairs([child])
    opened = Authenticator(KEYS.keyring(site.spec, [child])).open(site.auth.seal(repair))
    assert (opened.header.step, opened.header.phase) == (FIRST, REPAIR)
    assert np.array_equal(opened.payload, node.cached.payload)


def test_a_repair_of_an_edge_session_older_than_the_newest_seen_is_refused_and_counted(
        ) -> None:
    """The edge restarted (session 5, then 6) and changed its model; a cell that forgot
    its parameters asks for a repair. A repair carrying session 5's parameters (a
    replay, from a neighbour's login) was taken; only session 6's is now."""
    site = _Site()
    old_edge, new_edge = site.edge(session=5), site.edge(session=6)
    site.sample(FIRST)
    old_params = site.flood(old_edge, FIRST)
    site.sample(FIRST + 1)
    site.flood(new_edge, FIRST + 1)  # the edge's new run takes the mesh
    site.sample(FIRST + 2)
    new_edge.start_slot(FIRST + 2)
    site.begin(new_edge)
    new_edge.model.flat[0] += 1.0  # its model changed: the cells forget theirs
    new_params = site.flood(new_edge, FIRST + 2)
    cell = (2, 0)
    node = site.host.nodes[cell]
    assert node.cached is None and list(node.sessions) == [5, 6]
    node.begin_slot(FIRST + 3, site.now)  # no parameters: it asks its parent
    assert node.pending_slot == FIRST + 3
    replayed = make(Kind.PARAMS, site.spec.mesh_id, FIRST, node.parent, cell,
                    old_params, phase=REPAIR, session=5)
    assert node.handle(replayed, site.now) == []
    assert node.stats["rejected:stale_repair"] == 1 and node.cached is None
    genuine = make(Kind.PARAMS, site.spec.mesh_id, FIRST + 2, node.parent, cell,
                   new_params, phase=REPAIR, session=6)
    node.handle(genuine, site.now)
    assert node.stats["params_repaired"] == 1 and node.cached.session == 6
