"""Checks and inputs shared by several test modules."""

from __future__ import annotations

# A small mesh file (the run configuration TOML): 3 x 4 cells, mesh 7, edge at (0, 0).
SMALL_MESH_TOML = """\
[model]
rows = 3
cols = 4

[mesh]
mesh_id = 7
edge_at = [0, 0]
"""


def assert_one_line_error(code: int, err: str, expected_code: int, *needles: str) -> None:
    """A CLI failure: exit `expected_code`, one `error: ...` line naming every needle."""
    assert code == expected_code, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error:")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
