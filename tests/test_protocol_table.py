"""The protocol's table of message kinds (meshdl/protocol/kinds.py): one row per kind,
PROTOCOL.md prints it, and what it says agrees with the code that sends the messages."""

from __future__ import annotations

from pathlib import Path

from meshdl.config import ModelConfig
from meshdl.mqtt.acl import BLOCK_KINDS, EDGE_LINK_KINDS, NEIGHBOUR_KINDS
from meshdl.mqtt.session import QOS
from meshdl.protocol.accounting import class_name
from meshdl.protocol.auth import SIGNED_KINDS
from meshdl.protocol.kinds import KINDS, ROW, Party, markdown, sent_by
from meshdl.protocol.messages import CLASS_OF, EDGE, Kind
from meshdl.protocol.spec import MeshSpec

PROTOCOL = Path(__file__).resolve().parents[1] / "PROTOCOL.md"


def _documented_table() -> str:
    """The Markdown table under PROTOCOL.md's "## Message kinds" heading."""
    lines = PROTOCOL.read_text().splitlines()
    at = lines.index("## Message kinds") + 1
    while not lines[at].startswith("|"):
        at += 1
    end = at
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[at:end]) + "\n"


def test_every_kind_is_one_row_in_the_kinds_order() -> None:
    assert [row.kind for row in KINDS] == list(Kind)
    assert set(ROW) == set(Kind) and len(ROW) == len(KINDS)


def test_protocol_md_prints_the_table() -> None:
    assert _documented_table() == markdown(), \
        "PROTOCOL.md's kinds table differs from meshdl.protocol.kinds.markdown()"


def test_the_rows_read_their_facts_from_where_they_are_defined() -> None:
    for row in KINDS:
        assert row.ledger_class.split("/")[0] == CLASS_OF[row.kind]
        assert row.ledger_class.endswith("/convL") == (
            class_name(row.kind, 1) == f"{CLASS_OF[row.kind]}/conv1")
        assert row.signed == (row.kind in SIGNED_KINDS)


def test_only_what_would_stall_a_wave_or_a_step_travels_at_qos_1() -> None:
    # meshdl.mqtt publishes with the table's QoS. A lost PARAMS or BATCH stalls a whole
    # wave, a lost PUSH or WEIGHTS every synchronous mesh; a wave's own messages stay at
    # QoS 0 (a wave that loses one is restarted).
    assert QOS == {Kind.PARAMS: 1, Kind.BATCH: 1, Kind.PUSH: 1, Kind.WEIGHTS: 1}


def test_the_plans_sends_agree_with_the_table() -> None:
    """Who sends each planned message, and whether only training waves carry it."""
    for model, edge_at, dead in ((ModelConfig(rows=3, cols=4), (0, 0), frozenset()),
                                 (ModelConfig(rows=5, cols=6, kernel=5), (4, 2),
                                  frozenset({(2, 2)}))):
        spec = MeshSpec(1, model, edge_at, dead=dead)
        for src, sends in spec.sends.items():
            party = Party.EDGE if src == EDGE else Party.NODE
            for s in sends:
                row = ROW[s.kind]
                assert party in row.senders, (s.kind, party)
                assert s.train_only == row.training_only, s.kind


def test_what_a_node_may_publish_over_mqtt_is_what_the_table_has_nodes_send() -> None:
    """Over a broker the edge broadcasts PARAMS and BATCH: no node sends either."""
    by_nodes = {row.kind for row in sent_by(Party.NODE)} - SIGNED_KINDS
    assert by_nodes == set(NEIGHBOUR_KINDS + BLOCK_KINDS)
    assert set(EDGE_LINK_KINDS) == {row.kind for row in sent_by(Party.NODE)
                                    if row.receiver == "parent"}
    assert {row.kind for row in sent_by(Party.EDGE)} == {
        Kind.PARAMS, Kind.BATCH, Kind.SCATTER, Kind.PUSH}
