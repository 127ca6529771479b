"""`meshdl report` of an experiment's directory shows the table the console printed
(issue 33, item 6): each figure by its one title, in the table's order, `±` only where
the console put it; an older summary.json, without "table", is shown as before."""

from __future__ import annotations

import json
import re
from html import unescape
from typing import Any

from meshdl.report.page import build_report
from tests.test_cli_simulate import _meshdl


def _tables(page: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every table of `page`: its header and its rows of cells, as text."""
    found = []
    for table in re.findall(r"<table>(.*?)</table>", page, re.S):
        header = [unescape(h) for h in re.findall(r"<th>(.*?)</th>", table, re.S)]
        rows = [[unescape(c) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
                for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]]
        found.append((header, rows))
    return found


def _summary(**extra: Any) -> dict[str, Any]:
    """A loss sweep's summary.json, one seed at 0 % loss and three at 10 %."""
    def fig(mean: float, std: float) -> dict[str, float]:
        return {"mean": mean, "std": std}
    rows = [{"value": [0.0, "exact"], "seeds": 1, "absent_filled": fig(0.0, 0.0),
             "clean_test_acc": fig(0.893, 0.0), "test_acc": fig(0.893, 0.0)},
            {"value": [0.1, "zero"], "seeds": 3, "absent_filled": fig(2.0, 1.0),
             "clean_test_acc": fig(0.8723, 0.0037), "test_acc": fig(0.8259, 0.0182)}]
    return {"experiment": "loss", "mode": "virtual mesh", "seeds": 3, "rows": rows,
            **extra}


def test_an_experiments_page_shows_the_printed_table_by_titles_in_its_order(
        tmp_path) -> None:
    table = {"title": "loss: mean ± std over 3 seeds",
             "header": ["loss %", "policy", "seeds", "test %", "clean test %"],
             "rows": [["0", "exact", "1", "89.30", "89.30"],
                      ["10", "zero", "3", "82.59 ± 1.82", "87.23 ± 0.37"]]}
    columns = [{"key": "test_acc", "title": "test %"},
               {"key": "clean_test_acc", "title": "clean test %"},
               {"key": "absent_filled", "title": "absent filled"}]
    (tmp_path / "summary.json").write_text(json.dumps(
        _summary(table=table, columns=columns)))
    page = build_report(tmp_path)
    tables = _tables(page)
    assert (table["header"], table["rows"]) in tables
    assert "loss: mean ± std over 3 seeds" in unescape(page)
    # No figure by its raw key, and no `± 0` of one seed, anywhere on the page.
    for key in ("test_acc", "clean_test_acc", "absent_filled"):
        assert key not in page
    assert not re.search(r"± 0(\.0+)?(?![\d.])", unescape(page))
    # Every figure of summary.json, by its title, in "columns"' order, a share in
    # percent under a title in %.
    every, cells = next(t for t in tables if "absent filled" in t[0])
    assert every[-3:] == ["test %", "clean test %", "absent filled"]
    # The deviation to its mean's decimals, as the console's table writes it (one
    # formatter, issue 47 item 5).
    assert cells[1][-3:] == ["82.59 ± 1.82", "87.23 ± 0.37", "2.000 ± 1.000"]


def test_an_experiment_run_reports_the_console_s_table(tmp_path) -> None:
    """A real sweep (grid: one mesh wave a value): the page's first table is the one
    summary.json says the console printed."""
    run = tmp_path / "grid"
    code, _, err = _meshdl("experiment", "grid", "--values", "3", "--values", "5",
                           "--out", run)
    assert code == 0, err
    printed = json.loads((run / "summary.json").read_text())["table"]
    tables = _tables(build_report(run))
    assert tables[0] == (printed["header"], printed["rows"])
    assert "wave bytes" in printed["header"]


def test_an_older_summary_without_a_table_is_shown_as_before(tmp_path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps(_summary()))
    header, rows = _tables(build_report(tmp_path))[0]
    assert header == ["value", "seeds", "test_acc", "clean_test_acc", "absent_filled"]
    assert rows[0][2] == "0.8930" and "±" in rows[1][2]

