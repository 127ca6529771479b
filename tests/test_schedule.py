"""The per-layer compression plan (seed 000): exhaustive search finds the optimum of
the step model, and the model agrees with simulated time."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshdl.compress.compressors import Segment
from meshdl.config import RunConfig
from meshdl.data.lounge import generate_lounge
from meshdl.sim.radio.device import device
from meshdl.sim.radio.profiles import profile
from meshdl.sim.studies.planner import (
    ACTIVATIONS,
    Link,
    Option,
    StepModel,
    greedy_plan,
    optimal_plan,
    uniform_plans,
)
from meshdl.sim.studies.schedule import Setting, schedule
from tests.helpers import assert_one_line_error

SEGMENTS = (Segment("conv1", "conv", (3, 1, 3, 3), 3), Segment("conv2", "conv", (3, 3, 3, 3), 3),
            Segment("fc1", "fc", (8, 27), 8), Segment("fc2", "fc", (2, 8), 2))
SPECS = ("none", "fp16", "int8", "2bit", "topk:0.1", "ktopk", "powersgd:1")


def _model(per_byte: float, per_op: float, hops: float, meshes: int, lead: float,
           forward: dict[str, float]) -> StepModel:
    link = Link(lambda n: per_byte * n, lambda ops: per_op * ops)
    backhaul = Link(lambda n: per_byte / 50 * n, lambda ops: per_op / 10 * ops) \
        if meshes > 1 else None
    return StepModel(SEGMENTS, link, hops, 10.0, backhaul, meshes, True, lead, True, 0.1,
                     {"float32": 10.0, **forward})


def _options(model: StepModel, errors: dict[str, float]) -> list[Option]:
    from meshdl.compress.compressors import parse_compressor

    rows = []
    for segment in SEGMENTS:
        for spec in SPECS:
            compressor = parse_compressor(spec)
            if compressor.applies_to(segment):
                nbytes = compressor.nbytes(segment)
                rows.append(Option(segment.name, spec, nbytes, errors.get(spec, 0.0),
                                   model.radio.cpu_s(compressor.operations(segment)),
                                   model.radio.message_s(nbytes), 0.0))
    for fmt, error in (("float32", 0.0), ("fp16", 1e-4), ("int8", 5e-3)):
        rows.append(Option(ACTIVATIONS, fmt, 4, error, 0.0,
                           model.forward_waves[fmt] - 10.0, 0.0))
    return rows


@settings(max_examples=40, deadline=None)
@given(st.floats(1e-6, 1e-2), st.floats(0, 1e-5), st.floats(1, 50), st.sampled_from([1, 4]),
       st.floats(0, 5), st.floats(6, 10), st.floats(5, 10),
       st.dictionaries(st.sampled_from(SPECS[1:]), st.floats(0, 1)))
def test_the_optimal_plan_is_never_predicted_slower_than_greedy_or_any_uniform_plan(
        per_byte, per_op, hops, meshes, lead, fp16_wave, int8_wave, errors):
    model = _model(per_byte, per_op, hops, meshes, lead, {"fp16": fp16_wave,
                                                          "int8": int8_wave})
    options = _options(model, errors)
    budget = 0.95
    optimal = optimal_plan(options, model, budget)
    assert optimal.predicted_step_s <= greedy_plan(options, model, budget).predicted_step_s \
        + 1e-9
    for spec, plan in uniform_plans(SPECS, model).items():
        if errors.get(spec, 0.0) <= budget:  # a uniform plan the budget allows
            assert optimal.predicted_step_s <= plan.predicted_step_s + 1e-9, spec
    # Every choice it makes is within the error budget.
    for layer, spec in optimal.per_layer.items():
        if spec not in ("none", "float32") and layer != ACTIVATIONS:
            assert errors.get(spec, 0.0) <= budget


def test_a_push_the_overlap_hides_is_chosen_for_its_bytes_within_the_budget():
    """With several meshes the head's push overlaps the conv backward: once hidden, its
    compressor changes no step time, and the optimum takes the fewest bytes the error
    budget allows."""
    model = _model(1e-3, 0.0, 10, 4, lead=1e3, forward={"fp16": 10.0, "int8": 10.0})
    errors = {"2bit": 0.5, "topk:0.1": 0.6, "powersgd:1": 0.4, "ktopk": 0.5, "int8": 0.01,
              "fp16": 0.001}
    options = _options(model, errors)
    fc1 = [o for o in options if o.layer == "fc1"]
    smallest = min(fc1, key=lambda o: o.bytes)
    assert optimal_plan(options, model, 0.95).per_layer["fc1"] == smallest.compressor
    tight = optimal_plan(options, model, 0.3).per_layer["fc1"]
    assert errors.get(tight, 0.0) <= 0.3


@pytest.fixture(scope="module")
def small_schedule():
    config = RunConfig(model={"rows": 5, "cols": 6, "hidden": 12},
                       train={"batch": 10})
    data = generate_lounge(config.data)
    setting = Setting(config, data, profile("802.15.4"), "shared", device("cortex-m4"),
                      device("pi4"), None, 1, 2, 0)
    return schedule(setting, ("none", "fp16", "int8", "2bit", "ktopk", "powersgd:1",
                              "intsum"))


def test_predicted_and_simulated_step_times_agree_within_ten_percent(small_schedule):
    plans = small_schedule["plans"]
    for plan in [plans["optimal"], plans["greedy"], *plans["uniform"].values()]:
        assert plan["simulated_step_s"] == pytest.approx(plan["predicted_step_s"], rel=0.10)


def test_the_optimal_plan_simulates_no_slower_than_greedy_or_any_uniform_plan(
        small_schedule):
    plans = small_schedule["plans"]
    best = plans["optimal"]["simulated_step_s"]
    assert best <= plans["greedy"]["simulated_step_s"] + 1e-9
    for name, plan in plans["uniform"].items():
        assert best <= plan["simulated_step_s"] + 1e-9, name
    uniform_best = min(plans["uniform"].values(), key=lambda p: p["simulated_step_s"])
    assert plans["optimal"]["per_layer"] != uniform_best["per_layer"]


def test_intsum_is_measured_in_the_mesh_and_offered_for_the_whole_reduce(small_schedule):
    summed = small_schedule["summed"]["intsum"]
    assert summed["payload_bytes"] > 0 and set(summed["error"]) == {"conv1", "conv2"}
    rows = {(o["layer"], o["compressor"]): o for o in small_schedule["options"]}
    assert rows["conv1", "intsum"]["bytes"] + rows["conv2", "intsum"]["bytes"] == \
        pytest.approx(summed["payload_bytes"], abs=1)
    assert rows["conv2", "intsum"]["error"] == summed["error"]["conv2"]
    for plan in (small_schedule["plans"]["optimal"], small_schedule["plans"]["greedy"]):
        conv = {plan["per_layer"][name] for name in ("conv1", "conv2")}
        assert "intsum" not in conv or conv == {"intsum"}


def test_a_plan_sums_every_conv_layer_in_the_network_or_none():
    from meshdl.sim.studies.planner import Summed

    link = Link(lambda n: 1e-3 * n, lambda ops: 0.0)
    model = StepModel(SEGMENTS, link, 20.0, 10.0,
                      summed={"intsum": Summed(30.0, {"conv1": 0.1, "conv2": 0.1})})
    options = [Option(s.name, spec, nbytes, error, 0.0, 20.0 * link.message_s(nbytes), 0.0)
               for s in SEGMENTS[:2]
               for spec, nbytes, error in (("none", 4 * s.size, 0.0),
                                           ("int8", 4 + s.size, 0.01),
                                           ("intsum", 15, 0.1 if s.name == "conv1" else 0.9))]
    # conv2's intsum is over the budget: conv1 may not take it alone.
    for plan in (optimal_plan(options, model, 0.5), greedy_plan(options, model, 0.5)):
        assert plan.per_layer["conv1"] != "intsum", plan
    loose = optimal_plan(options, model, 1.0)
    assert (loose.per_layer["conv1"], loose.per_layer["conv2"]) == ("intsum", "intsum")
    assert loose.predicted_step_s < optimal_plan(options, model, 0.5).predicted_step_s
    # With more levels conv2 is within the budget: both layers take them, one sum.
    finer = StepModel(SEGMENTS, link, 20.0, 10.0, summed={
        "intsum": Summed(30.0, {"conv1": 0.1, "conv2": 0.9}),
        "intsum:15": Summed(40.0, {"conv1": 0.05, "conv2": 0.3})})
    options += [Option(s.name, "intsum:15", 20, 0.3, 0.0, 20.0 * link.message_s(20), 0.0)
                for s in SEGMENTS[:2]]
    plan = optimal_plan(options, finer, 0.5)
    assert (plan.per_layer["conv1"], plan.per_layer["conv2"]) == ("intsum:15", "intsum:15")


def test_the_schedule_command_prints_the_options_and_the_three_kinds_of_plan(cli):
    code, out, _ = cli("schedule", "--rows", "4", "--cols", "5", "--hidden", "8", "--batch",
                       "5", "--candidate", "none", "--candidate", "2bit", "--candidate",
                       "int8", "--json")
    assert code == 0
    report = json.loads(out)
    assert {"layer", "compressor", "bytes", "error", "compression_s", "communication_s",
            "overlapped_s"} <= set(report["options"][0])
    plans = report["plans"]
    assert set(plans["uniform"]) == {"none", "2bit", "int8"}
    for plan in [plans["optimal"], plans["greedy"], *plans["uniform"].values()]:
        assert {"per_layer", "predicted_step_s", "simulated_step_s"} <= set(plan)


@pytest.mark.parametrize("flags, needle", [
    (["--candidate", "2bit"], "none must be"),
    (["--candidate", "none", "--candidate", "zip"], "unknown compressor"),
    (["--radio", "carrier-pigeon"], "carrier-pigeon"),
])
def test_an_impossible_schedule_is_a_one_line_error(cli, flags, needle):
    code, _, err = cli("schedule", *flags)
    assert_one_line_error(code, err, 2, needle)


def test_compress_plan_is_resolved_before_the_run_and_written_into_its_configuration(
        cli, tmp_path):
    run = tmp_path / "run"
    code, _, err = cli("simulate", "train", "--rows", "4", "--cols", "5", "--hidden", "8",
                       "--epochs", "1", "--radio", "ble", "--compress", "plan", "--out", run)
    assert code == 0, err
    assert "compression plan for ble" in err
    mesh = json.loads((run / "config.json").read_text())["mesh"]
    assert mesh["compress"].startswith("conv1=") and mesh["activations"] in (
        "float32", "fp16", "int8")


def test_the_tree_factor_grows_with_the_sums_each_hop_compresses_again():
    from meshdl.sim.studies.planner import tree_error_factor

    assert tree_error_factor([1]) == 1.0  # one node: one compression
    chain = tree_error_factor([3, 2, 1])  # a chain: every hop carries most of the sum
    star = tree_error_factor([3, 1, 1])  # a star: the leaves carry little
    assert chain > star > 1.0
    assert chain == pytest.approx((1 + 4 / 9 + 1 / 9) ** 0.5)
