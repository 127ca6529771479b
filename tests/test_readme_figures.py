"""The README's figures of the seed run are what a reader gets from the command it names.

Countable figures are what the mesh counts: its waves (the training loop's batches and
evaluation passes) and its messages (a training wave's and an inference wave's, measured
here). Test accuracies come from a seeded run, the same on every run of this code on one
kind of CPU (float32 sums round by the vector width LLVM picks for it, so another CPU may
end a test map or two apart): the README names the command and the CPU, and where this is
that CPU the command is run and must give them (issue 43 item 11: README quoted 97.15 %
and 96.61 %, a fresh clone gave 96.79 % and 96.97 %). Wall times vary by machine and load:
the README quotes the range docs/results/benchmarks.md measured, with its command and
machine, and the ratio to the central run measured in the same run; no test times
anything."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from meshdl.config import ModelConfig, load_run_config
from meshdl.data.datasets import Dataset
from meshdl.model.cnn import CNN
from meshdl.protocol.spec import MeshSpec
from meshdl.sim.mesh import MeshEngine
from meshdl.training.loop import EVAL_BATCH

README = Path(__file__).resolve().parent.parent / "README.md"
BENCHMARKS = README.parent / "docs" / "results" / "benchmarks.md"
# The section of benchmarks.md whose table README's run times and accuracies come from.
MEASURED = "## The figures README quotes"


class Machine(NamedTuple):
    """A machine as the docs name it: "a 2-core AMD EPYC (LLVM target `znver3`)"."""

    cores: int
    cpu: str
    llvm_target: str


def _text(path: Path) -> str:
    return " ".join(path.read_text().split())


def _machine(text: str) -> Machine:
    found = re.search(r"a (\d+)-core ([A-Z][\w -]*?) \(LLVM target `([\w-]+)`\)", text)
    assert found, "no machine named as 'a N-core CPU (LLVM target `name`)'"
    return Machine(int(found.group(1)), found.group(2), found.group(3))


def _accuracies(text: str) -> list[tuple[str, str]]:
    """Every seed-run accuracy the README states: ("96.79", "central"), ..."""
    return re.findall(r"(\d+\.\d+) % (central|in the mesh)", text)


def _measured() -> tuple[str, list[dict[str, str]]]:
    """benchmarks.md's MEASURED section (its text) and its table's rows by column."""
    text = BENCHMARKS.read_text()
    assert MEASURED in text, f"benchmarks.md has no section {MEASURED!r}"
    section = text[text.index(MEASURED):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    lines = [line for line in section.splitlines() if line.startswith("|")]
    cells = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]
    header, rows = cells[0], cells[2:]
    return " ".join(section.split()), [dict(zip(header, row, strict=True)) for row in rows]


def _same_digits(readme_figure: str, value: float) -> str:
    """`value` written with as many decimals as the README's figure has."""
    decimals = len(readme_figure.partition(".")[2])
    return f"{value:,.{decimals}f}"


def _waves(config, spec: MeshSpec) -> tuple[int, int]:
    """(training waves, inference waves) of a run: every epoch's batches and its test
    pass, then the final pass over the training set; a pass goes in EVAL_BATCH chunks,
    each as many waves as the message size limit needs."""
    def passes(n: int) -> int:
        return sum(math.ceil(min(EVAL_BATCH, n - start) / spec.max_batch)
                   for start in range(0, n, EVAL_BATCH))

    train, test = config.data.train, config.data.test
    epochs = config.train.epochs
    return epochs * math.ceil(train / config.train.batch), \
        epochs * passes(test) + passes(train)


def test_the_readmes_seed_run_figures_are_what_the_mesh_counts() -> None:
    text = " ".join(README.read_text().split())
    found = re.search(r"20 epochs: (\d+) waves, ([\d.]+) million messages", text)
    assert found, "the README no longer states the seed run's waves and messages"
    config = load_run_config()  # the seed experiment's defaults
    spec = MeshSpec(1, config.model, config.mesh.edge_at)
    training, inference = _waves(config, spec)
    assert training + inference == int(found.group(1))

    maps = np.zeros((config.train.batch, config.model.rows, config.model.cols), np.float32)
    labels = np.zeros(len(maps), np.int64)
    engine = MeshEngine(Dataset(maps, labels, maps, labels, {}))
    model = CNN(ModelConfig())
    model.set_normalization(20.0, 2.0)
    engine.loss_and_grads(model, np.arange(len(maps)))
    per_training_wave = engine.report()["total_messages"]
    engine.logits(model, "test", np.arange(len(maps)))
    per_inference_wave = engine.report()["total_messages"] - per_training_wave
    total = training * per_training_wave + inference * per_inference_wave
    assert round(total / 1e6, 2) == float(found.group(2))


def test_the_readmes_accuracies_name_their_command_and_cpu() -> None:
    text = _text(README)
    assert _accuracies(text), "the README no longer states the seed run's accuracies"
    machine = _machine(text)
    assert re.search(r"`meshdl bench mesh`[^.]*? \d+\.\d+ % central, \d+\.\d+ % in the mesh",
                     text), "the accuracies do not follow the command that gives them"
    assert machine == _machine(_measured()[0]), "README and benchmarks.md name other machines"


def test_the_readmes_accuracies_are_benchmarks_md_measured_pair() -> None:
    # The table's column says which is which ("central / mesh"): the pair cannot be
    # read both ways.
    _, rows = _measured()
    pairs = {row["test accuracy central / mesh (%)"] for row in rows}
    assert len(pairs) == 1, f"the measured runs disagree: {pairs}"
    central, mesh = (figure.strip() for figure in pairs.pop().split("/"))
    for figure, which in _accuracies(_text(README)):
        assert figure == (central if which == "central" else mesh), (figure, which)


def test_the_readmes_run_times_are_the_range_benchmarks_md_measured() -> None:
    text = _text(README)
    _, rows = _measured()
    mesh = re.search(r"took ([\d.]+) to ([\d.]+) s in the virtual mesh, ([\d.]+) to "
                     r"([\d.]+) times the central run", text)
    machines = re.search(r"([\d,.]+) to ([\d,.]+) s through the node machines \(([\d.]+) "
                         r"to ([\d.]+) times", text)
    assert mesh and machines, "the README's run times are not ranges of measured runs"
    columns = ("virtual mesh (s)", "mesh / central", "node machines (s)", "machines / central")
    for found, pair in ((mesh, columns[:2]), (machines, columns[2:])):
        for i, column in enumerate(pair):
            values = [float(row[column]) for row in rows if row[column]]
            low, high = found.group(2 * i + 1), found.group(2 * i + 2)
            assert (low, high) == (_same_digits(low, min(values)),
                                   _same_digits(high, max(values))), column


@pytest.mark.slow
def test_the_readmes_accuracies_are_what_the_named_command_gives_on_the_named_cpu() -> None:
    from llvmlite import binding

    text = _text(README)
    machine = _machine(text)
    here = binding.get_host_cpu_name()
    if here != machine.llvm_target:
        pytest.skip(f"the README's accuracies are {machine.llvm_target}'s; this CPU is {here}")
    # As a user runs it: the shipped build, not the suite's bounds-checked one (whose
    # checks keep LLVM from vectorizing sums, so it rounds them in another order).
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_BOUNDSCHECK", "NUMBA_CACHE_DIR")}
    run = subprocess.run([sys.executable, "-m", "meshdl", "bench", "mesh", "--json"],
                         capture_output=True, text=True, timeout=600, check=True, env=env)
    result = json.loads(run.stdout)
    got = {"central": f"{100 * result['central']['test_acc']:.2f}",
           "in the mesh": f"{100 * result['mesh']['test_acc']:.2f}"}
    for figure, which in _accuracies(text):
        assert figure == got[which], f"README: {figure} % {which}; the run: {got[which]} %"
