"""`meshdl plan --cell`: one node's part of a wave, from the plan the node itself runs."""

from __future__ import annotations

import json

from meshdl.config import ModelConfig
from meshdl.messages import HEADER_BYTES, ITEM_BYTES
from meshdl.protocol import MeshSpec
from meshdl.topics import name_of
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
    for m in report["receives"] + report["sends"]:
        if m["values_per_sample"] and m["kind"] != "BATCH":
            assert m["bytes"] == HEADER_BYTES + ITEM_BYTES * m["values_per_sample"] * 7
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
