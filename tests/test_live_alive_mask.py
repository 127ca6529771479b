"""A live run of a head that takes the alive mask (the global recipe's): each node reads
its reading beside a 1, as a live sensor's node records it, so the mesh's alerts are
central inference's slot after slot (the mask read as the reading made them differ)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_cli_simulate import _meshdl


def test_a_head_with_the_alive_mask_alerts_as_central_inference(tmp_path: Path) -> None:
    code, stdout, err = _meshdl("simulate", "live", "--rows", "6", "--cols", "6", "--pool",
                                "global", "--slots", "6", "--timed-slots", "3", "--out",
                                tmp_path / "run", "--json")
    assert code == 0, err
    report = json.loads(stdout)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model"]["alive"] is True and config["model"]["in_channels"] == 2
    assert report["alerts_equal_central"] is True
    assert report["alerts"]["mesh_differ_from_central"] == 0
