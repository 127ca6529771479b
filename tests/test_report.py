"""`meshdl report RUN_DIR`: a self-contained HTML page (every plot embedded, nothing
fetched) for an experiment's, a training run's and a simulated run's directory, and it
renders in a real headless Chromium with every image loaded."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.helpers import assert_one_line_error
from tests.test_cli_simulate import _meshdl

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="module")
def runs(small_data_file, tmp_path_factory) -> dict[str, Path]:
    """A filter-size experiment and a training run, each with its report.html."""
    root = tmp_path_factory.mktemp("runs")
    code, _, err = _meshdl("experiment", "filter-size", "--sizes", "1", "--sizes", "3",
                           "--seeds", "1", "--epochs", "1", "--batch", "40", "--hidden",
                           "8", "--data", small_data_file, "--out", root / "experiment")
    assert code == 0, err
    code, _, err = _meshdl("train", "--data", small_data_file, "--epochs", "2", "--batch",
                           "40", "--hidden", "8", "--out", root / "train")
    assert code == 0, err
    code, _, err = _meshdl("simulate", "train", "--data", small_data_file, "--epochs", "1",
                           "--batch", "40", "--hidden", "8", "--out", root / "simulate")
    assert code == 0, err
    code, _, err = _meshdl("simulate", "live", "--rows", "4", "--cols", "5", "--slots", "3",
                           "--timed-slots", "2", "--out", root / "live")
    assert code == 0, err
    # The training run, as if it had collapsed to one class: its page leads with a warning.
    shutil.copytree(root / "train", root / "collapsed")
    metrics = json.loads((root / "collapsed" / "metrics.json").read_text())
    metrics["final"].update(single_class=True, predicted_per_class={"train": [0, 9],
                                                                    "test": [0, 3]})
    (root / "collapsed" / "metrics.json").write_text(json.dumps(metrics))
    for run in RUNS:
        code, _, err = _meshdl("report", root / run)
        assert code == 0, err
    return {run: root / run for run in RUNS}


RUNS = ("experiment", "train", "simulate", "live", "collapsed")


def _images(page: str) -> list[str]:
    return re.findall(r'<img [^>]*src="([^"]*)"', page)


@pytest.mark.parametrize(("run", "plots", "needles"), [
    ("experiment", 2, ["meshdl experiment filter-size", "halo sent", "94.4"]),
    ("train", 1, ["meshdl train run", "Training curves", "halo/conv1", "test accuracy (%)"]),
    ("simulate", 2, ["meshdl simulate run", "Under simulated time", "802.15.4",
                     "Energy per node"]),
    ("live", 3, ["meshdl simulate live", "Where the batteries die", "4 x 5 nodes"])])
def test_the_report_is_one_self_contained_page_with_its_tables_and_plots(
        runs, run, plots, needles) -> None:
    page = (runs[run] / "report.html").read_text()
    images = _images(page)
    assert len(images) == plots
    assert all(src.startswith("data:image/png;base64,") for src in images)
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing to fetch
    assert "<script" not in page
    for needle in [*needles, "Configuration", "numpy"]:
        assert needle in page


def test_report_out_writes_where_it_is_told(runs, tmp_path) -> None:
    target = tmp_path / "deep" / "page.html"
    code, _, err = _meshdl("report", runs["train"], "--out", target)
    assert code == 0, err
    assert target.read_text().startswith("<!DOCTYPE html>")


def test_a_directory_that_is_no_run_or_holds_corrupt_json_exits_1(tmp_path) -> None:
    """A wrong or corrupt file, as README says (exit 2 is for a wrong request)."""
    code, _, err = _meshdl("report", tmp_path)
    assert_one_line_error(code, err, 1, "not a run directory")
    for corrupt in ("{not json", "[" * 200_000):  # the second nests past the parser
        (tmp_path / "metrics.json").write_text(corrupt)
        code, _, err = _meshdl("report", tmp_path)
        assert_one_line_error(code, err, 1, "metrics.json: not valid JSON")


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                    reason="chromium and chromedriver are not installed (./bootstrap --dev "
                           "installs them with apt where it can)")
@pytest.mark.parametrize("run", RUNS)
def test_the_report_renders_in_headless_chromium_with_every_image_loaded(
        runs, run, tmp_path) -> None:
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,1400"):
        options.add_argument(flag)
    browser = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        browser.set_page_load_timeout(60)
        browser.get((runs[run] / "report.html").resolve().as_uri())
        widths = browser.execute_script(
            "return Array.from(document.images, i => i.complete ? i.naturalWidth : 0);")
        # Where the warnings are drawn: their tops, the first section's, their colour.
        warnings = browser.execute_script(
            "const h2 = document.querySelector('h2').getBoundingClientRect().top;"
            "return Array.from(document.querySelectorAll('.warning'), w => [w.getBoundingC"
            "lientRect().top, h2, getComputedStyle(w).backgroundColor]);")
        screenshot = browser.get_screenshot_as_png()
    finally:
        browser.quit()
    assert len(widths) == len(_images((runs[run] / "report.html").read_text())) > 0
    assert all(width > 0 for width in widths)
    # Every warning where a reader looks: above the first section, in the first screen,
    # on its own colour (issue 47 item 4). (Which apply: tests/test_report_warnings.py;
    # these tiny runs collapse, and simulate train's console names the weaker baseline.)
    page = (runs[run] / "report.html").read_text()
    assert len(warnings) == page.count('class="warning"') >= (run == "collapsed")
    for top, first_section, colour in warnings:
        assert 0 < top < first_section < 1400 and colour != "rgba(0, 0, 0, 0)"
    assert screenshot[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "screenshot.png").write_bytes(screenshot)


def test_a_missing_run_directory_or_a_file_in_its_place_exits_1(cli, tmp_path) -> None:
    """README: a missing or wrong file exits 1, as `evaluate` says of a directory given
    as its model file (`report` said 'not a directory' with exit 2)."""
    code, _, err = cli("report", tmp_path / "nonexistent")
    assert_one_line_error(code, err, 1, "run directory not found", "nonexistent")
    some_file = tmp_path / "file.txt"
    some_file.write_text("x")
    code, _, err = cli("report", some_file)
    assert_one_line_error(code, err, 1, "is a file, not a run directory")
    code, _, err = cli("evaluate", tmp_path, some_file)
    assert_one_line_error(code, err, 1, "is a directory, not a model file")
