"""`meshdl plan --cell`: one node's part of a wave, from the plan the node itself runs."""

from __future__ import annotations

import json

from meshdl.config import ModelConfig
from meshdl.protocol.kinds import Party, sent_by
from meshdl.protocol.messages import HEADER_BYTES, ITEM_BYTES
from meshdl.protocol.payloads import BATCH_HEAD
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topics import name_of
from tests.helpers import SMALL_MESH_TOML, assert_one_line_error


def _plan(cli, tmp_path, *args: str) -> dict:
    mesh = tmp_path / "mesh.toml"
    mesh.write_text(SMALL_MESH_TOML)
    code, out, err = cli("plan", "--mesh", mesh, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_a_corner_cell_expects_exactly_the_halos_its_neighbours_send_it(cli, tmp_path) -> None:
    report = _plan(cli, tmp_path, "--cell", "r2c3", "--batch", "7")  # 3 x 4 grid: a corner
    spec = MeshSpec(7, ModelConfig(rows=3, cols=4), (0, 0), "broadcast")
    expected = {(k.name, layer, phase, name_of(src))
                for k, layer, phase, src in spec.expects[(2, 3)]}
    got = {(m["kind"], m["layer"], m["phase"], m["peer"]) for m in report["receives"]
           if m["kind"] not in ("PARAMS", "BATCH", "REDUCE")}
    assert got == expected
    assert {m["peer"] for m in report["receives"] if m["kind"] == "HALO"} == {"r1c3", "r2c2"}
    fixed = {"PARAMS": spec.params_size, "REDUCE": spec.conv_size, "BATCH": BATCH_HEAD}
    for m in report["receives"] + report["sends"]:
        values = m["values_per_sample"] * 7 + fixed.get(m["kind"], 0)
        assert m["bytes"] == HEADER_BYTES + ITEM_BYTES * values, m
        assert m["topic"].startswith("meshdl/7/")
    assert not report["role"]["linked_to_edge"]


def test_the_edges_cell_gathers_to_the_edge_and_its_computations_wait_for_their_inputs(
        cli, tmp_path) -> None:
    report = _plan(cli, tmp_path, "--cell", "0,0")
    assert report["role"]["linked_to_edge"] and report["role"]["parent"] == "edge"
    to_edge = {m["kind"] for m in report["sends"] if m["peer"] == "edge"}
    assert to_edge == {"GATHER", "REDUCE"}
    conv2 = next(c for c in report["computes"] if c["stage"] == "conv2")
    assert any(w.startswith("HALO layer 2") for w in conv2["waits_for"])
    route = next(c for c in report["computes"] if c["stage"] == "route")
    assert any("pooled of block" in w for w in route["waits_for"])  # pooled first


def test_a_cell_outside_the_grid_is_a_one_line_usage_error(cli, tmp_path) -> None:
    mesh = tmp_path / "mesh.toml"
    mesh.write_text(SMALL_MESH_TOML)
    for cell in ("r9c9", "x1", "1,2,3"):
        code, _, err = cli("plan", "--mesh", mesh, "--cell", cell)
        assert_one_line_error(code, err, 2, "--cell")


def test_the_flags_of_meshdl_cost_override_the_mesh_file(cli, tmp_path) -> None:
    report = _plan(cli, tmp_path, "--cell", "r4c0", "--rows", "5", "--edge-at", "4,0",
                   "--batch", "3")
    assert report["batch"] == 3 and report["role"]["linked_to_edge"]
    spec = MeshSpec(7, ModelConfig(rows=5, cols=4), (4, 0), "broadcast")
    assert len(report["sends"]) == len(spec.sends[(4, 0)]) + 1  # and its REDUCE
    assert {(m["kind"], m["peer"]) for m in report["sends"]} >= {("GATHER", "edge"),
                                                                ("REDUCE", "edge")}
    radio = _plan(cli, tmp_path, "--cell", "r0c0", "--transport", "radio")
    relayed = {(m["kind"], m["peer"]) for m in radio["sends"] if m["kind"] in ("PARAMS", "BATCH")}
    assert relayed == {(kind, child) for kind in ("PARAMS", "BATCH")
                       for child in radio["role"]["children"]}
    assert {m["peer"] for m in radio["receives"] if m["kind"] == "PARAMS"} == {"edge"}


def test_the_human_plan_goes_to_stdout_in_wave_order(cli, tmp_path) -> None:
    mesh = tmp_path / "mesh.toml"
    mesh.write_text(SMALL_MESH_TOML)
    code, out, err = cli("plan", "--config", mesh, "--cell", "r1c1")
    assert code == 0 and not err.strip(), err
    assert out.index("receives") < out.index("computes") < out.index("sends")
    assert "meshdl/7/r0c1/r1c1/halo" in out and "conv2" in out


def test_the_plan_lists_a_nodes_kinds_from_the_protocols_table(cli, tmp_path) -> None:
    report = _plan(cli, tmp_path, "--cell", "r0c0", "--transport", "radio")
    rows = sent_by(Party.NODE)
    assert [k["kind"] for k in report["kinds"]] == [row.kind.name for row in rows]
    assert [{key: v for key, v in k.items() if key != "in_this_plan"}
            for k in report["kinds"]] == [row.record() for row in rows]
    sent = {m["kind"] for m in report["sends"]}
    assert {k["kind"] for k in report["kinds"] if k["in_this_plan"]} == sent
    assert {"PARAMS", "BATCH", "REDUCE"} <= sent and "HEALTH" not in sent
    mesh = tmp_path / "mesh.toml"
    code, out, err = cli("plan", "--config", mesh, "--cell", "r1c1")
    assert code == 0, err
    assert out.index("sends") < out.index("message kinds a node sends") < out.index("HEALTH")
