"""The production mesh under attack: `meshdl bench hostile`.

Sets up what a deployment runs (deploy/mosquitto/production.conf with TLS, passwords and
the generated ACL; every process with its own message keys; the broker's size limits
`meshdl deploy credentials` derives for the mesh, or a chosen one), trains the
configuration over MQTT with two node hosts and an edge, each its own
process, and does it twice: clean, then while a hostile client logged in with one node's
password floods every topic its ACL allows (sim/faults/hostile.py). Each run reports whether
every process lived, the peak memory of each (the broker's too) and the size of the
broker's store when it stopped, the largest difference of the trained parameters from
the virtual mesh's, and what was rejected where; the attack run also what the attacker
sent and its memory next to the clean run's. Besides its flood of every topic, the
attacker publishes a status record claiming one cell ~32,750 times once a second,
1,040,000-byte messages to its neighbour on the other host, and 400 retained messages
of that size below its own name.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from meshdl.bench.mqtt import _toml
from meshdl.config import RunConfig
from meshdl.data.datasets import Dataset, save_dataset
from meshdl.errors import MeshdlError
from meshdl.model.cnn import CNN
from meshdl.mqtt.acl import parse_acl
from meshdl.mqtt.localbroker import HOST, Mosquitto, free_port, production_config, stop_process
from meshdl.mqtt.session import BrokerAddress
from meshdl.mqtt.sizes import LIMITS_DIR, broker_limits, message_limits
from meshdl.mqtt.status import MAX_STATUS_BYTES
from meshdl.protocol.spec import MeshSpec
from meshdl.protocol.topics import name_of
from meshdl.sim.faults.hostile import FLOOD_BYTES, FLOOD_MB_PER_S, Attacker
from meshdl.training.loop import train

RETAINED_FILL = 400  # retained messages of 1,040,000 bytes the attacker leaves
FLOOD_FIRST = 200  # 1 MB messages out to the flooded cell before the first wave
# The whole flood: over a gigabyte, more than the 1,138 queued messages that took a host
# from 181 to 1,386 MB before its inbox was bounded. A burst, not an endless stream: a
# broker without per-client rate limits (Mosquitto 2.0) drops the genuine QoS 0
# messages of a client whose queue a faster sender keeps full, so while a flood outruns
# the host's reading no wave to it gets through (it is restarted); after it, training
# goes on to the same parameters.
FLOOD_TOTAL = 1_200
# How long a run may take before the harness stops its edge (counted as not trained):
# a sustained flood ends only with training, so something else must bound the run.
RUN_LIMIT_S = 900.0


@dataclass(frozen=True)
class Flood:
    """The attacker's flood of its neighbour: `total` messages (None: sustained, until
    the run ends) of `message_bytes` on the wire, at `mb_per_s` (None: as fast as the
    broker takes them)."""

    total: int | None = FLOOD_TOTAL
    mb_per_s: float | None = FLOOD_MB_PER_S
    message_bytes: int = FLOOD_BYTES

    def __str__(self) -> str:
        total = "sustained" if self.total is None else f"{self.total} messages"
        rate = "full speed" if self.mb_per_s is None else f"{self.mb_per_s:g} MB/s"
        return f"{total} of {self.message_bytes:,} B at {rate}"


BURST = Flood()  # issue 29's: 1.2 GB at 400 MB/s
FLOODS = ("burst", "sustained", "small")


def flood_of(kind: str, mb_per_s: float | None, small_bytes: int) -> Flood:
    """The flood `meshdl bench hostile --flood KIND` sends: issue 29's burst, 1 MB
    messages without end, or messages of `small_bytes` (the broker's limit: the largest
    a login may still send) without end; the last two at `mb_per_s` (None: full speed)."""
    if kind not in FLOODS:
        raise ValueError(f"{kind!r} is not one of {', '.join(FLOODS)}")
    return {"burst": BURST,
            "sustained": Flood(total=None, mb_per_s=mb_per_s),
            "small": Flood(total=None, mb_per_s=mb_per_s, message_bytes=small_bytes)}[kind]


def bench_hostile(config: RunConfig, data: Dataset, log: Any = None,
                  attack: tuple[bool, ...] = (False, True),
                  raise_on_failure: bool = True, flood: Flood = BURST,
                  broker_message_bytes: int | None = None,
                  run_limit_s: float = RUN_LIMIT_S) -> dict[str, Any]:
    """Train `config` over the production setup, clean and under attack. A run whose
    edge fails raises, unless `raise_on_failure` is off: then its result says so (the
    edge's exit code and last words) next to everything else it measured.

    `flood`: what the attacker sends its neighbour; `broker_message_bytes`: the broker's
    message_size_limit, and every process's mesh.max_message_bytes (None: what `meshdl
    deploy credentials` derives for the mesh, as a deployment gets it); `run_limit_s`:
    when the harness stops an edge still running."""
    say = log or (lambda _text: None)
    chosen = broker_message_bytes
    limit = broker_limits(config).message_size_limit if chosen is None else chosen
    config = config.model_copy(update={"mesh": config.mesh.model_copy(update={
        "auth": True, "max_message_bytes": limit})})
    say("training the reference in the virtual mesh")
    reference, _ = train(config, data)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="meshdl-hostile-") as tmp:
        setup = _ProductionSetup(Path(tmp), config, data, flood, chosen, run_limit_s)
        for hostile in attack:
            name = "attack" if hostile else "clean"
            say(f"{name} run: broker, two node hosts, edge"
                + (f", and the attacker ({flood})" if hostile else ""))
            runs[name] = setup.run(reference, hostile, say, raise_on_failure)
    if "clean" in runs and "attack" in runs:
        runs["attack"]["memory_vs_clean"] = {
            proc: runs["attack"]["peak_rss_mb"][proc] / runs["clean"]["peak_rss_mb"][proc]
            for proc in runs["clean"]["peak_rss_mb"]}
        runs["attack"]["memory_over_clean_mb"] = {
            proc: runs["attack"]["peak_rss_mb"][proc] - runs["clean"]["peak_rss_mb"][proc]
            for proc in runs["clean"]["peak_rss_mb"]}
    return {"grid": [config.model.rows, config.model.cols], "epochs": config.train.epochs,
            "train_samples": len(data.y_train), "test_samples": len(data.y_test),
            "flood": str(flood), "broker_message_bytes": limit,
            "broker_limit_from": "deploy credentials" if chosen is None else "chosen",
            **runs}


class _ProductionSetup:
    """Credentials, certificates, mesh and data files, shared by the runs."""

    def __init__(self, folder: Path, config: RunConfig, data: Dataset, flood: Flood = BURST,
                 broker_message_bytes: int | None = None,
                 run_limit_s: float = RUN_LIMIT_S) -> None:
        self.folder, self.config = folder, config
        # What the broker takes: chosen, or derived by `deploy credentials` (which the
        # config's mesh.max_message_bytes then already is).
        self.flood = flood
        self.broker_message_bytes = broker_message_bytes or config.mesh.max_message_bytes
        self.run_limit_s = run_limit_s
        self.mesh_file = folder / "mesh.toml"
        self.mesh_file.write_text(_toml(config))
        self.data_file = save_dataset(data, folder / "data.npz")
        rows, cols = config.model.rows, config.model.cols
        half = (rows + 1) // 2  # the north host serves the first rows, the south the rest
        self.hosts = {"north": f"0-{half - 1},0-{cols - 1}",
                      "south": f"{half}-{rows - 1},0-{cols - 1}"}
        self.creds = folder / "broker" / "meshdl"
        secrets = self.creds / "secrets"
        _meshdl("deploy", "credentials", "--mesh", str(self.mesh_file), "--out",
                str(self.creds), *(f"--host={name}={cells}" for name, cells in
                                   self.hosts.items()), "--keys-dir", str(secrets))
        if broker_message_bytes is not None:  # the broker's limits file says this instead
            limits_dir = self.creds / LIMITS_DIR
            for written in limits_dir.glob("*.conf"):
                written.unlink()
            (limits_dir / "message-size-chosen.conf").write_text("".join(
                f"{option} {value}\n" for option, value in
                message_limits(broker_message_bytes).items()))
        self.ca = _self_signed(self.creds / "tls")
        (folder / "broker" / "data").mkdir()  # the broker's persistence
        # The attacker: a cell of the north host next to the south host's, so that the
        # south host hears what its login may write (a host hears its own cells' talk in
        # process, never through the broker).
        self.attacker = (half - 1, min(1, cols - 1))
        self.attacker_user = name_of(self.attacker)
        self.env = {user: _env_file(secrets / f"{user}.env")
                    for user in ("north", "south", "edge", self.attacker_user)}
        if broker_message_bytes is not None:  # every process plans within it
            for env in self.env.values():
                env["MESHDL_MESH__MAX_MESSAGE_BYTES"] = str(broker_message_bytes)

    def run(self, reference: CNN, hostile: bool, say: Any,
            raise_on_failure: bool = True) -> dict[str, Any]:
        tls_port, local_port = free_port(), free_port()
        broker = Mosquitto(self.folder / "broker", port=tls_port, config_text=production_config(
            self.folder / "broker", tls_port, local_port)).start(timeout=10)
        log_from = broker.log.stat().st_size if broker.log.exists() else 0
        broker_pid = broker.process.pid if broker.process is not None else 0
        url = f"mqtts://{HOST}:{tls_port}"
        logs = self.folder / ("attack" if hostile else "clean")
        logs.mkdir()
        processes: dict[str, subprocess.Popen[bytes]] = {}
        peaks: dict[str, float] = {}
        attacker, stop_attack = None, threading.Event()
        started = time.perf_counter()
        try:
            for name, cells in self.hosts.items():
                processes[name] = self._start(name, logs, "nodes", "run", "--cells", cells,
                                              "--broker", url, "--mesh", str(self.mesh_file),
                                              "--data", str(self.data_file))
            if hostile:
                attacker = self._attack(url, stop_attack)
                flood_from = time.perf_counter()
                # Training starts under the flood, not before it.
                _flooding(attacker[0], self.broker_message_bytes)
            processes["edge"] = self._start(
                "edge", logs, "edge", "run", "--broker", url, "--mesh", str(self.mesh_file),
                "--data", str(self.data_file), "--out", str(logs / "run"), "--json",
                "--nodes-timeout", "120", "--wave-timeout", "30")
            edge = processes["edge"]
            pids = lambda: {"broker": broker_pid,  # noqa: E731
                            **{name: p.pid for name, p in processes.items()}}
            limit = time.perf_counter() + self.run_limit_s
            while edge.poll() is None and time.perf_counter() < limit:
                for name, pid in pids().items():
                    peaks[name] = max(peaks.get(name, 0.0), _peak_rss_mb(pid))
                time.sleep(0.25)
            wall = time.perf_counter() - started
            flood_s = time.perf_counter() - flood_from if hostile else 0.0
            flood_bytes = attacker[0].flood_sent_bytes if attacker is not None else 0
            timed_out = edge.poll() is None  # stopped below: not trained
            alive = {name: p.poll() is None for name, p in processes.items() if name != "edge"}
            for name, pid in pids().items():
                peaks[name] = max(peaks.get(name, 0.0), _peak_rss_mb(pid))
        finally:
            stop_attack.set()
            if attacker is not None:
                attacker[1].join(30)
            stops = {}
            for name, process in processes.items():
                began = time.perf_counter()
                stop_process(process, timeout=10)
                stops[name] = time.perf_counter() - began
            broker.stop(timeout=30)  # (it writes its store as it stops)
        store = self.folder / "broker" / "data" / "mosquitto.db"
        edge_said = (logs / "edge.err").read_text(errors="replace")[-1500:]
        if timed_out:
            edge_said = f"stopped by the harness after {self.run_limit_s:g} s; {edge_said}"
        broker_log = broker.log_text()[log_from:]
        if edge.returncode != 0 and raise_on_failure:
            raise MeshdlError(f"the edge failed (exit {edge.returncode}): {edge_said}")
        trained = edge.returncode == 0 and not timed_out
        model = CNN.load(logs / "run" / "model.npz") if trained else None
        metrics = json.loads((logs / "run" / "metrics.json").read_text()) if trained else {}
        scale = float(np.abs(reference.flat).max())
        diff = float(np.abs(model.flat - reference.flat).max()) if model else float("inf")
        result = {
            "wall_s": wall,
            "node_hosts_alive_at_end": alive,
            "edge_exit": edge.returncode,
            "host_exits": {n: p.returncode for n, p in processes.items() if n != "edge"},
            "sigterm_s": {n: stops[n] for n in ("north", "south")},
            "peak_rss_mb": peaks,
            "broker_store_mb": store.stat().st_size / 2**20 if store.exists() else 0.0,
            "edge_error": None if trained else edge_said,
            "max_param_diff": diff,
            "max_param_diff_relative": diff / scale,
            "test_acc": metrics["final"]["test_acc"] if "final" in metrics else None,
            "host_stop_lines": {n: _last_line(logs / f"{n}.err", "stopped:")
                                for n in ("north", "south")},
            "edge_rejected": {k: v for part in ("session", "engine", "edge")
                              for k, v in metrics.get("comm", {}).get(part, {}).items()
                              if k.startswith("rejected")},
            "restarted_waves": metrics.get("comm", {}).get("edge", {}).get(
                "restarted_waves", 0),
            "checkpoint_left": (logs / "run" / "checkpoint.npz").exists(),
            # What the broker said it dropped for a client whose queue was full (its
            # genuine QoS 0 messages among them), and whom it threw out for a packet
            # above max_packet_size.
            "broker_dropping_lines": broker_log.count("Outgoing messages are being dropped"),
            "broker_oversize_disconnects": broker_log.count("due to oversize packet"),
        }
        if attacker is not None:
            result["attacker"] = self.attacker_user
            # What the generated ACL lets its login write: what it can leave retained.
            result["attacker_write_grants"] = [
                g.topic for g in parse_acl((self.creds / "acl").read_text())[
                    self.attacker_user] if g.access != "read"]
            result["attacker_sent"] = dict(attacker[0].sent)
            result["attacker_disconnects"] = dict(attacker[0].errors)
            result["flood_mb_per_s"] = flood_bytes / 1e6 / flood_s if flood_s else 0.0
        return result

    def _start(self, name: str, logs: Path, *args: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, **self.env[name], "SSL_CERT_FILE": str(self.ca),
               "PYTHONUNBUFFERED": "1"}
        return subprocess.Popen([sys.executable, "-m", "meshdl", *args],
                                stdout=(logs / f"{name}.out").open("wb"),
                                stderr=(logs / f"{name}.err").open("wb"), env=env)

    def _attack(self, url: str, stop: threading.Event) -> tuple[Attacker, threading.Thread]:
        login = self.env[self.attacker_user]
        address = BrokerAddress.parse(url, env={**login})
        spec = MeshSpec(self.config.mesh.mesh_id, self.config.model, self.config.mesh.edge_at,
                        "broadcast", self.config.mesh.max_message_bytes, True)
        # Its neighbour on the other host hears it through the broker: the flood's target.
        south = (self.attacker[0] + 1, self.attacker[1])
        attacker = Attacker(spec, address, self.attacker, cafile=self.ca,
                            claim_bomb=MAX_STATUS_BYTES, flood_cell=south,
                            retained_fill=RETAINED_FILL, flood_total=self.flood.total,
                            flood_bytes=self.flood.message_bytes,
                            flood_mb_per_s=self.flood.mb_per_s)
        thread = threading.Thread(target=lambda: asyncio.run(attacker.run(stop.is_set)),
                                  name="attacker", daemon=True)
        thread.start()
        return attacker, thread


def _flooding(attacker: Attacker, limit: int | None = None, timeout: float = 120.0) -> None:
    """Wait until the attacker has published a few rounds, left all its retained
    messages and sent FLOOD_FIRST flood messages (its TLS login and first flood take a
    while; a short training run could otherwise be over before it begins). A broker
    whose message_size_limit (`limit`) is below its flood's or retained messages throws
    it out for each: then training starts once that happened a few times."""
    deadline = time.monotonic() + timeout
    refused = limit is not None and max(attacker.flood_bytes, FLOOD_BYTES) > limit
    while attacker.rounds < 3 or attacker.filled < attacker.retained_fill or \
            (attacker.flood_cell is not None and
             attacker.sent[attacker.flood_counter] < FLOOD_FIRST):
        if refused and attacker.rounds >= 3 and sum(attacker.errors.values()) >= 10:
            return
        if time.monotonic() > deadline:
            raise MeshdlError(f"the attacker did not get its flood out in {timeout:.0f} s "
                              f"({attacker.rounds} rounds, {attacker.filled} retained; "
                              f"disconnects: {dict(attacker.errors)})")
        time.sleep(0.05)


def _meshdl(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "meshdl", *args], capture_output=True,
                            text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise MeshdlError(f"meshdl {args[0]} {args[1]} failed: {result.stderr.strip()}")


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines()
                if line and not line.startswith("#"))


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MiB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _last_line(path: Path, prefix: str) -> str | None:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if prefix in ln]
    return lines[-1] if lines else None


def _self_signed(folder: Path) -> Path:
    """A throwaway CA-less certificate for 127.0.0.1 (ca.crt is the certificate itself)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(HOST)), x509.DNSName("localhost")]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (folder / "server.crt").write_bytes(pem)
    (folder / "ca.crt").write_bytes(pem)
    (folder / "server.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    os.chmod(folder / "server.key", 0o600)
    return folder / "ca.crt"


def main(argv: list[str] | None = None) -> None:
    """`python -m meshdl.bench.hostile [--flood burst|sustained|small] ...`: the bench
    with the flood and broker limit chosen, its result as JSON on stdout (progress on
    stderr); what `meshdl bench hostile` runs with the defaults."""
    import argparse

    from meshdl.config import load_run_config
    from meshdl.data.lounge import generate_lounge

    parser = argparse.ArgumentParser(prog="python -m meshdl.bench.hostile")
    parser.add_argument("--flood", choices=FLOODS, default="burst")
    parser.add_argument("--small-bytes", type=int, default=None,
                        help="the small flood's message size (default: the broker's limit)")
    parser.add_argument("--mb-per-s", type=float, default=None,
                        help="the sustained or small flood's rate (default: full speed)")
    parser.add_argument("--broker-message-bytes", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--attack-only", action="store_true")
    parser.add_argument("--run-limit", type=float, default=RUN_LIMIT_S)
    args = parser.parse_args(argv)
    config = load_run_config(model={"rows": 4, "cols": 5, "hidden": 8},
                             data={"train": 40, "test": 20, "seed": 4},
                             train={"epochs": args.epochs, "batch": 10})
    flood = flood_of(args.flood, args.mb_per_s, args.small_bytes or
                     args.broker_message_bytes or broker_limits(config).message_size_limit)
    result = bench_hostile(config, generate_lounge(config.data),
                           log=lambda text: print(text, file=sys.stderr, flush=True),
                           attack=(True,) if args.attack_only else (False, True),
                           raise_on_failure=False, flood=flood,
                           broker_message_bytes=args.broker_message_bytes,
                           run_limit_s=args.run_limit)
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
