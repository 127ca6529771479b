"""`meshdl bench ...`: speed against a reference measured in the same run.

Each benchmark loads what it measures (Numba kernels, the mesh, the data generator)
when it runs, not for `meshdl --help`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from meshdl.cli.common import emit_json, err_console, out_console
from meshdl.cli.options import (
    Cols,
    Filters,
    Hidden,
    JsonFigures,
    Kernel,
    Optimizer,
    Rows,
    SeedConfig,
    json_option,
)
from meshdl.config import ModelConfig, load_run_config
from meshdl.errors import UsageError

app = typer.Typer(help="Benchmarks (ratios against a reference measured in the same run).",
                  no_args_is_help=True)


@app.command("kernels")
def kernels(
    rows: Rows = 17, cols: Cols = 25, kernel: Kernel = 3, filters: Filters = 5,
    hidden: Hidden = 200,
    batch: int = typer.Option(100, "--batch", min=1),
    repeats: int = typer.Option(200, "--repeats", min=1),
    threads: int = typer.Option(1, "--threads", min=1, help="Threads for both sides "
                                "(meshdl: the faster of 1 and this many, call by call, as "
                                "training chooses)."),
    optimizer: Optimizer = "sgd",
    busy: int = typer.Option(0, "--busy", min=0, help="CPU-bound processes running beside "
                             "both sides (1 on a 2-core machine: the other core busy)."),
    json_out: JsonFigures = False,
) -> None:
    """One training step (forward, backward, update) in meshdl vs PyTorch CPU."""
    from meshdl.bench.kernels import bench_kernels

    config = ModelConfig(rows=rows, cols=cols, kernel=kernel, filters=filters, hidden=hidden)
    result = bench_kernels(config, batch=batch, repeats=repeats, threads=threads,
                           optimizer=optimizer, busy=busy)
    if json_out:
        emit_json(result)
        return
    ours = result["meshdl"]
    out_console.print(f"meshdl  one step: median {ours['median_ms']:.3f} ms, min "
                      f"{ours['min_ms']:.3f} ms ({threads} thread(s), batch {batch}"
                      f"{f', {busy} busy core(s)' if busy else ''}; first "
                      f"call incl. compile/cache load {ours['first_call_s']:.2f} s)")
    if threads > 1:
        runs = ", ".join(f"{n} thread(s) {c}" for n, c in ours["calls_per_thread_count"].items())
        out_console.print(f"        calls run with {runs}")
    if result["torch"] is None:
        out_console.print("PyTorch is not installed: no reference (pip install torch==2.13.0)")
        return
    ref = result["torch"]
    out_console.print(f"PyTorch {ref['version']}: median {ref['median_ms']:.3f} ms, min "
                      f"{ref['min_ms']:.3f} ms")
    out_console.print(f"speed-up vs PyTorch: {result['speedup_vs_torch']:.2f}x")


@app.command("mesh")
def mesh(
    epochs: int | None = typer.Option(None, "--epochs", min=1, help="Default: the "
                                      "configuration's (the seed experiment: 20)."),
    config_file: SeedConfig = None,
    machines: bool = typer.Option(False, "--machines", help="Also train through the node "
                                  "machines (every message a Python call, as over MQTT), "
                                  "and check that it ends with the same model."),
    json_out: JsonFigures = False,
) -> None:
    """A training run in the in-process virtual mesh vs the same run in central mode."""
    from meshdl.bench.mesh import bench_mesh
    from meshdl.data.lounge import generate_lounge

    config = load_run_config(config_file, train={"epochs": epochs})
    with err_console.status("generating the synthetic lounge data set"):
        data = generate_lounge(config.data)
    result = bench_mesh(config, data, machines, log=lambda text: err_console.print(text))
    if json_out:
        emit_json(result)
        return
    central, ours = result["central"], result["mesh"]
    rows, cols = result["grid"]
    out_console.print(
        f"{rows} x {cols} grid, {result['train_samples']} samples, batch {result['batch']}, "
        f"{result['epochs']} epoch(s)")
    out_console.print(f"central: {central['wall_s']:.1f} s, test acc {central['test_acc']:.4f}")
    out_console.print(f"mesh:    {ours['wall_s']:.1f} s, test acc {ours['test_acc']:.4f}; "
                      f"{ours['waves']} waves ({ours['ms_per_wave']:.0f} ms each)")
    out_console.print(f"         {ours['messages']} messages ({ours['messages_per_s']:.0f}/s)")
    out_console.print(f"mesh / central: {result['ratio_to_central']:.1f}x")
    if machines:
        slow = result["machines"]
        same = "the same model" if slow["same_model"] else "ANOTHER MODEL"
        out_console.print(f"through the node machines: {slow['wall_s']:.1f} s "
                          f"({slow['ratio_to_central']:.1f}x central), {same}")


@app.command("mqtt")
def mqtt(
    epochs: int = typer.Option(1, "--epochs", min=1),
    broker: str | None = typer.Option(None, "--broker", help="A running broker (default: "
                                      "a private Mosquitto on a free port)."),
    config_file: SeedConfig = None,
    via_broker: bool = typer.Option(False, "--via-broker", help="Every message of the mesh "
                                    "through the broker, as between separate nodes (by "
                                    "default the node host passes its cells' messages to "
                                    "each other in process)."),
    json_out: JsonFigures = False,
) -> None:
    """Epochs over a real broker with one node host, vs the broker's own throughput."""
    from meshdl.bench.mqtt import bench_mqtt
    from meshdl.data.lounge import generate_lounge

    config = load_run_config(config_file, train={"epochs": epochs})
    data = generate_lounge(config.data)
    result = bench_mqtt(config, data, broker, log=lambda text: err_console.print(text),
                        via_broker=via_broker)
    if json_out:
        emit_json(result)
        return
    out_console.print(
        f"{result['epochs']} epoch(s) of {result['train_samples']} samples, batch "
        f"{result['batch']}, {result['cells']} cells in one node host: "
        f"{result['wall_s_per_epoch']:.1f} s per epoch, {result['messages']} mesh messages "
        f"({result['messages_per_s']:.0f}/s), {result['broker_deliveries']} of them through "
        f"the broker ({result['broker_deliveries_per_s']:.0f}/s)")
    out_console.print(f"the broker alone (mosquitto_pub -> mosquitto_sub): "
                      f"{result['broker_messages_per_s']:.0f} messages/s; ratio "
                      f"{result['ratio_to_broker']:.2f} (mesh messages), "
                      f"{result['deliveries_ratio_to_broker']:.3f} (broker deliveries)")


@app.command("hostile")
def hostile(
    epochs: int = typer.Option(2, "--epochs", min=1),
    config_file: SeedConfig = None,
    flood: Literal["burst", "sustained", "small"] = typer.Option(
        "burst", "--flood", help="What the stolen login sends its neighbour on the other "
        "host: burst (1.2 GB of 1 MB messages at 400 MB/s), sustained (1 MB messages "
        "until training ends) or small (messages of the broker's limit, the largest it "
        "lets through, until training ends)."),
    mb_per_s: float | None = typer.Option(
        None, "--mb-per-s", min=0.001, help="The sustained or small flood's rate "
        "(default: as fast as the broker takes it)."),
    broker_message_bytes: int | None = typer.Option(
        None, "--broker-message-bytes", min=1024, help="The broker's message_size_limit "
        "and every process's mesh.max_message_bytes (default: what `meshdl deploy "
        "credentials` derives for the mesh; 1048576: production.conf's fallback)."),
    run_limit: float = typer.Option(
        900.0, "--run-limit", min=1.0, help="Seconds after which the harness stops an edge "
        "still training (counted as not trained)."),
    attack_only: bool = typer.Option(False, "--attack-only", help="Skip the clean run."),
    json_out: JsonFigures = False,
) -> None:
    """The production setup (TLS, passwords, ACL, message keys, the mesh's size limits)
    trains over MQTT with two node hosts, clean and while a client with one node's
    password floods every topic it may write; vs the virtual mesh's parameters and the
    clean run's memory."""
    from meshdl.bench.hostile import bench_hostile, flood_of
    from meshdl.data.lounge import generate_lounge
    from meshdl.mqtt.sizes import broker_limits

    config = load_run_config(config_file, train={"epochs": epochs})
    if flood == "burst" and mb_per_s is not None:
        raise UsageError("--mb-per-s: the burst keeps issue 29's 400 MB/s; give it with "
                         "--flood sustained or small")
    small = broker_message_bytes or broker_limits(config).message_size_limit
    data = generate_lounge(config.data)
    result = bench_hostile(config, data, log=lambda text: err_console.print(text),
                           attack=(True,) if attack_only else (False, True),
                           raise_on_failure=False, flood=flood_of(flood, mb_per_s, small),
                           broker_message_bytes=broker_message_bytes,
                           run_limit_s=run_limit)
    if json_out:
        emit_json(result)
        return
    out_console.print(f"broker limit {result['broker_message_bytes']:,} B "
                      f"({result['broker_limit_from']}); flood: {result['flood']}",
                      highlight=False)
    for name in ("clean", "attack"):
        if name not in result:
            continue
        run = result[name]
        memory = ", ".join(f"{proc} {mb:.0f} MB" for proc, mb in run["peak_rss_mb"].items())
        out_console.print(f"{name}: {run['wall_s']:.0f} s, edge exit {run['edge_exit']}, "
                          f"hosts alive {run['node_hosts_alive_at_end']}, max parameter "
                          f"difference to the virtual mesh {run['max_param_diff']:.2e}; "
                          f"peak memory {memory}", highlight=False)
    attack = result["attack"]
    out_console.print(f"attacker sent {attack['attacker_sent']} ({attack['flood_mb_per_s']:.1f}"
                      f" MB/s of flood), thrown out {attack['broker_oversize_disconnects']} "
                      f"times; restarted waves {attack['restarted_waves']}"
                      + (f"; memory under attack vs clean: {attack['memory_over_clean_mb']}"
                         if "memory_over_clean_mb" in attack else ""), highlight=False)


def _seed_range(text: str, flag: str) -> list[int]:
    """'0-9' or '3' or '0-4,11' -> the seeds; a one-line usage error otherwise."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or int(high or low) < int(low):
            raise UsageError(f"{flag} {text!r}: expected seeds like 0-9 or 0-4,11")
        seeds.extend(range(int(low), int(high or low) + 1))
    return seeds


@app.command("recipe")
def recipe(
    data_seeds: str = typer.Option("100-109", "--data-seeds", help="Data sets, as "
                                   "`meshdl data generate --seed` makes them: 0-9, 3,7."),
    train_seeds: str = typer.Option("0-2", "--train-seeds", help="Training seeds per "
                                    "data set."),
    mode: Literal["central", "mesh"] = typer.Option("central", "--mode", help="Where the "
                                                    "network runs (mesh: slower)."),
    config_file: Path | None = typer.Option(None, "--config", help="TOML configuration "
                                            "(default: the default recipe)."),
    json_out: json_option("Print the table as JSON on stdout.") = False,
) -> None:
    """The training recipe over many data sets and seeds: mean, worst, collapsed runs."""
    from meshdl.bench.recipe import bench_recipe

    config = load_run_config(config_file, mode=mode)
    result = bench_recipe(config, _seed_range(data_seeds, "--data-seeds"),
                          _seed_range(train_seeds, "--train-seeds"),
                          log=lambda text: err_console.print(text, highlight=False))
    if json_out:
        emit_json(result)
        return
    out_console.print(
        f"{len(result['runs'])} runs ({result['mode']}): mean test acc "
        f"{result['mean_test_acc']:.4f}, worst {result['min_test_acc']:.4f}, "
        f"{result['under_floor']} under {result['floor']:.0%}, "
        f"{result['single_class']} predicting one class", highlight=False)


@app.command("sim")
def sim(
    rows: int = typer.Option(100, "--rows", help="Rows of the large mesh's wave."),
    cols: int = typer.Option(100, "--cols", help="Columns of the large mesh's wave."),
    radio: str = typer.Option("802.15.4", "--radio", help="Radio profile."),
    epochs: int | None = typer.Option(None, "--epochs", min=0, help="Epochs of the training "
                                      "run compared (default: the seed experiment's 20; "
                                      "0: no training run)."),
    pairs: int = typer.Option(1, "--pairs", min=1, help="Training runs of each kind, one "
                              "after the other; the medians are reported."),
    json_out: JsonFigures = False,
) -> None:
    """Simulated time: one inference wave on a large mesh, and a training run against the
    plain virtual mesh's wall time."""
    from meshdl.bench.sim import bench_large_wave, bench_training
    from meshdl.data.lounge import generate_lounge

    err_console.print(f"one inference wave on a {rows} x {cols} mesh", highlight=False)
    result = {"large_wave": bench_large_wave(rows, cols, radio)}
    if epochs != 0:
        config = load_run_config(train={"epochs": epochs})
        with err_console.status("generating the synthetic lounge data set"):
            data = generate_lounge(config.data)
        result["training"] = bench_training(config, data, radio,
                                            log=lambda text: err_console.print(text),
                                            pairs=pairs)
    if json_out:
        emit_json(result)
        return
    wave = result["large_wave"]
    out_console.print(f"{rows} x {cols} inference wave: {wave['wave_wall_s']:.1f} s wall "
                      f"({wave['events']:,} events, {wave['events_per_s']:,.0f}/s), "
                      f"{wave['simulated_s']:.1f} s simulated")
    if "training" in result:
        t = result["training"]
        out_console.print(f"training, {t['epochs']} epochs: virtual mesh "
                          f"{t['virtual_wall_s']:.1f} s, simulated time {t['timed_wall_s']:.1f}"
                          f" s: {t['ratio_to_virtual']:.2f}x (same parameters: "
                          f"{t['same_parameters']})" + (
                              "; pairs: " + ", ".join(
                                  f"{p['ratio_to_virtual']:.2f}x" for p in t["pairs"])
                              if len(t["pairs"]) > 1 else ""))


@app.command("memory")
def memory(
    large: bool = typer.Option(True, "--large/--no-large", help="Also a 100 x 100 mesh "
                               "(batch 100; a few minutes)."),
    json_out: JsonFigures = False,
) -> None:
    """Peak memory of one wave with the memory plan and without (seed 002): the seed mesh
    at batch 100 and 1024, a 100 x 100 mesh; tracemalloc and the resident set, each
    measurement in a fresh process."""
    from meshdl.bench.memory import LARGE_CASES, SEED_CASES, bench_memory

    cases = SEED_CASES + (LARGE_CASES if large else [])
    result = bench_memory(cases, log=lambda text: err_console.print(text, highlight=False))
    if json_out:
        emit_json(result)
        return
    for row in result["cases"]:
        without, with_plan = row["without"], row["with"]
        out_console.print(
            f"{row['case']}: traced peak {without['traced_peak_mb']:.1f} -> "
            f"{with_plan['traced_peak_mb']:.1f} MB ({-row['traced_saving']:+.0%}), resident "
            f"peak {without['rss_peak_mb']:.0f} -> {with_plan['rss_peak_mb']:.0f} MB "
            f"({-row['rss_saving']:+.0%})", highlight=False)


@app.command("compress")
def compress(
    waves: int = typer.Option(10, "--waves", min=1, help="Training waves of the seed "
                              "network per policy."),
    json_out: JsonFigures = False,
) -> None:
    """Compression's wall time: training waves with each policy against the plain virtual
    mesh, and the encode + decode of one REDUCE and one PUSH."""
    from meshdl.bench.compress import bench_compress
    from meshdl.data.augment import training_data
    from meshdl.data.lounge import generate_lounge

    config = load_run_config()
    with err_console.status("generating the synthetic lounge data set"):
        data = training_data(config.train, generate_lounge(config.data), config.model)
    result = bench_compress(config, data, waves, log=lambda text: err_console.print(text))
    if json_out:
        emit_json(result)
        return
    for row in result["policies"]:
        codec = "" if row["reduce_us"] is None else \
            f"; REDUCE {row['reduce_us']:.0f} us, PUSH {row['push_us']:,.0f} us"
        out_console.print(f"{row['policy']}: {row['ratio_to_plain']:.2f}x the plain mesh"
                          f"{codec}", highlight=False)
