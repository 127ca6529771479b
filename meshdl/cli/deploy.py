"""`meshdl deploy`: provision a mesh for a real Mosquitto broker.

`meshdl deploy credentials --mesh mesh.toml --out DIR` writes, for the mesh the config
describes:

    DIR/passwd              Mosquitto password_file: every user, hashed by mosquitto_passwd
    DIR/acl                 Mosquitto acl_file: what each user may read and write
    DIR/secrets/<user>.env  the plain password of one user, for its systemd unit
    DIR/secrets/<user>.keys.json  the message keys of the cells the user acts for (and the
                            edge's signing key, for `edge`): meshdl/protocol/auth.py
    DIR/limits.d/message-size-<N>-mesh<M>.conf  the broker's size limits for this mesh, which
                            production.conf includes: its largest legitimate message
                            with headroom (meshdl/mqtt/sizes.py); every .env file gives
                            its process the same figure as mesh.max_message_bytes

Users: `edge`, one per cell (`r<row>c<col>`), one per node host (`--host NAME=CELLS`:
the topics of its cells' links that leave it, as it passes its own cells' messages in
process; `--via-broker` for hosts run with `meshdl nodes run --via-broker`), and a
read-only `monitor` (meshdl/mqtt/acl.py has the rules). A mesh whose [parallel]
section trains it with other meshes lets its edge hear the parameter server's weights.

`meshdl deploy central --mesh mesh.toml --central mqtts://HOST --out DIR` provisions the
central broker of several meshes (the [parallel] section's): its passwd and acl for
the parameter server `ps` and one bridge per mesh, their secrets, the keys of the links
edge-ps (one random key per mesh: `secrets/ps.keys.json` holds all of them for the
server, `secrets/push-<mesh>.keys.json` one for that mesh's edge, which
`secrets/push-<mesh>.environment` names as MESHDL_PARALLEL__KEYS: no login, so not a
.env file), and
`DIR/limits.d/` (the central broker's size limits: the whole model's PUSH and
WEIGHTS), `DIR/bridge-<mesh>.conf`, the bridge's connection with its password, which each
building's Mosquitto reads from a private directory through `include_dir`, never from
mosquitto.conf itself (docs/parallel.md). The bridge goes over TLS to `mqtts://HOST[:PORT]`
or `HOST:8883`, checking the central broker's certificate against `--central-ca` (the CA
file as installed on the buildings' brokers) or the system's CAs; `mqtt://HOST[:PORT]`
or another port bridges in clear, with a warning. Passwords come from
`secrets.token_urlsafe`, the mesh's link secret and the edge's Ed25519 key from
`secrets.token_bytes`; they are never printed. Every user's .env file turns message
authentication on (`MESHDL_MESH__AUTH=true`) and names its key file as it will be
installed (`--keys-dir`, /etc/meshdl/secrets by default). Every file is mode 0600 (the secrets
directory 0700). Existing files are left alone unless `--force`, which replaces every
password at once, so that passwd and the secrets files always belong together.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from meshdl.cli.common import emit_json, err_console
from meshdl.cli.options import KeysDir, json_option
from meshdl.config import load_run_config
from meshdl.errors import MeshdlError, UsageError
from meshdl.mqtt.sizes import (
    LIMITS_DIR,
    BrokerLimits,
    broker_limits,
    central_limits,
    limits_conf,
    limits_file_name,
    readme_examples,
)
from meshdl.mqtt.tools import find_tool

# The ACL rules and the message keys need the protocol (and it Numba): loaded when a
# command runs, not for `meshdl --help`.
if TYPE_CHECKING:
    from meshdl.mqtt.acl import MeshUser
    from meshdl.protocol.topology import Cell

# The hash every Mosquitto 2.x broker reads: 2.1's mosquitto_passwd defaults to argon2id,
# which a 2.0 broker (Debian 12, Raspberry Pi OS) cannot check.
HASH = "sha512-pbkdf2"
PASSWORD_BYTES = 24  # 192 random bits, 32 URL-safe characters

app = typer.Typer(
    help="Provision a mesh for a real broker: passwords, access rules, secrets.",
    no_args_is_help=True,
)


@app.command()
def credentials(
    mesh: Path = typer.Option(
        ..., "--mesh", help="The mesh's config (mesh.toml: [model] rows/cols, [mesh] "
                            "mesh_id/edge_at)."),
    out: Path = typer.Option(..., "--out", help="Directory for passwd, acl and secrets/."),
    host: list[str] | None = typer.Option(
        None, "--host", help="A node host NAME=ROWS,COLS serving a rectangle of cells, "
                             "e.g. floor1=0-3,0-24 (repeatable)."),
    via_broker: bool = typer.Option(
        False, "--via-broker", help="The node hosts run with `meshdl nodes run "
        "--via-broker` (their own cells' messages through the broker too): grant them "
        "those topics. By default a host may write only its links that leave it."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files (every "
                                                      "password and key changes)."),
    keys_dir: KeysDir = Path("/etc/meshdl/secrets"),
    as_json: json_option("Print what was written as JSON.") = False,
) -> None:
    """Write the broker's password and ACL files and one secrets file per user."""
    from meshdl.mqtt.acl import acl_text, mesh_users
    from meshdl.protocol.auth import KEY_BYTES, MeshKeys
    from meshdl.protocol.messages import EDGE
    from meshdl.protocol.spec import MeshSpec
    from meshdl.protocol.topics import name_of
    from meshdl.protocol.topology import Topology

    cfg = load_run_config(mesh)
    rows, cols = cfg.model.rows, cfg.model.cols
    topology = Topology(rows, cols, cfg.mesh.edge_at, cfg.model.pool)
    hosts = _parse_hosts(host or [], rows, cols)
    limits = broker_limits(cfg)  # before writing anything: the batch must fit
    try:
        users = mesh_users(cfg.mesh.mesh_id, topology, hosts,
                           parameter_server=cfg.parallel.meshes > 1,
                           hosts_via_broker=via_broker)
    except ValueError as exc:
        raise UsageError(f"--host: {exc}") from None
    tool = find_tool("mosquitto_passwd")  # before writing anything

    secrets_dir = out / "secrets"
    keyed = [u for u in users if u.role != "monitor"]  # the monitor sends no messages
    targets = [out / "passwd", out / "acl", *(secrets_dir / f"{u.name}.env" for u in users),
               *(secrets_dir / f"{u.name}.keys.json" for u in keyed), *_limits_files(out)]
    passwords = _fresh_passwords(users, targets, force, out, secrets_dir)
    header = (f"meshdl mesh {cfg.mesh.mesh_id}: {rows} x {cols} cells, edge at "
              f"{name_of(cfg.mesh.edge_at)}; written by `meshdl deploy credentials`")
    _write_private(out / "acl", acl_text(users, header))
    limits_file = _write_limits(out, limits_conf(limits, header, readme_examples()),
                                limits_file_name(limits, f"mesh{cfg.mesh.mesh_id}"))
    _hash_passwords(tool, out / "passwd", passwords)
    keys = MeshKeys(secrets.token_bytes(KEY_BYTES), secrets.token_bytes(KEY_BYTES))
    spec = MeshSpec(cfg.mesh.mesh_id, cfg.model, cfg.mesh.edge_at, "broadcast", auth=True)
    for user in users:
        key_file = keys_dir / f"{user.name}.keys.json" if user in keyed else None
        _write_private(secrets_dir / f"{user.name}.env",
                       _env_text(user, passwords[user.name], cfg.mesh.mesh_id, key_file,
                                 limits.message_size_limit))
        if key_file is not None:
            parties = [EDGE] if user.role == "edge" else list(user.cells)
            _write_private(secrets_dir / key_file.name,
                           keys.keyring(spec, parties).to_json())

    report = _report(out, cfg.mesh.mesh_id, (rows, cols), users)
    report["limits"] = _limits_report(limits, limits_file)
    err_console.print(
        f"wrote {out / 'passwd'}, {out / 'acl'}, {limits_file} and {len(users)} secrets "
        f"files in {secrets_dir} for mesh {cfg.mesh.mesh_id}: edge, {rows * cols} cells, "
        f"{len(hosts)} node host(s), monitor", highlight=False)
    _say_limits(limits, f"mesh {cfg.mesh.mesh_id}")
    if as_json:
        emit_json(report)


@app.command()
def central(
    mesh: Path = typer.Option(..., "--mesh", help="A mesh file whose parallel section "
                              "names the meshes (meshes, first_mesh_id)."),
    central_address: str = typer.Option(
        ..., "--central", help="The central broker as the buildings' brokers reach it: "
        "mqtts://HOST[:PORT] (TLS, 8883 by default), HOST:8883 (TLS too), "
        "mqtt://HOST[:PORT] or HOST:PORT (in clear)."),
    central_ca: str | None = typer.Option(
        None, "--central-ca", help="The CA certificate that signed the central broker's, "
        "as installed on each building's broker (a path there, e.g. "
        "/etc/mosquitto/meshdl/central-ca.crt); implies TLS. Default: the system's CAs."),
    out: Path = typer.Option(..., "--out", help="Directory for passwd, acl, secrets/ and "
                             "the bridge-<mesh>.conf files."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
    keys_dir: KeysDir = Path("/etc/meshdl/secrets"),
) -> None:
    """Write the central broker's passwd and acl (the parameter server and one bridge per
    mesh), their secrets, the keys of the links between each mesh's edge and the
    parameter server, and each building's bridge configuration."""
    from meshdl.mqtt.acl import CentralBroker, acl_text, bridge_config, central_users
    from meshdl.protocol.auth import PushKeys
    from meshdl.training.parallel import mesh_ids

    cfg = load_run_config(mesh)
    if cfg.parallel.meshes < 2:
        raise UsageError(f"{mesh}: its [parallel] section trains one mesh; a central "
                         "broker serves two or more")
    try:
        address = CentralBroker.parse(central_address, central_ca)
    except ValueError as exc:
        raise UsageError(f"--central {exc}") from None
    meshes = mesh_ids(cfg)
    users = central_users(meshes)
    tool = find_tool("mosquitto_passwd")
    secrets_dir = out / "secrets"
    limits = central_limits(cfg)
    targets = [out / "passwd", out / "acl", *(out / f"bridge-{m}.conf" for m in meshes),
               *(secrets_dir / f"{u.name}.env" for u in users),
               secrets_dir / SERVER_KEYS,
               *(secrets_dir / name for m in meshes for name in _push_files(m)),
               *_limits_files(out)]
    passwords = _fresh_passwords(users, targets, force, out, secrets_dir)
    header = (f"meshdl central broker of meshes {', '.join(map(str, meshes))}; written by "
              "`meshdl deploy central`")
    _write_private(out / "acl", acl_text(users, header))
    limits_file = _write_limits(out, limits_conf(limits, header),
                                limits_file_name(limits, "central"))
    _hash_passwords(tool, out / "passwd", passwords)
    push = PushKeys.draw(meshes)
    for user in users:
        text = _env_text(user, passwords[user.name], meshes[0], None)
        if user.role == "server":  # takes only pushes tagged with their mesh's key
            text += _push_env(keys_dir / SERVER_KEYS, auth=True)
        _write_private(secrets_dir / f"{user.name}.env", text)
    _write_private(secrets_dir / SERVER_KEYS, push.to_json())
    for m in meshes:
        keys_name, env_name = _push_files(m)
        _write_private(secrets_dir / keys_name, push.only(m).to_json())
        _write_private(secrets_dir / env_name,
                       f"# meshdl mesh {m}: the edge's key of its link to the parameter "
                       "server.\n# A second EnvironmentFile of the edge's unit (after "
                       "edge.env); mode 0600.\n" + _push_env(keys_dir / keys_name))
        # The bridge's password: this file goes into a private directory that the
        # building's mosquitto.conf includes (include_dir), never into mosquitto.conf.
        _write_private(out / f"bridge-{m}.conf",
                       bridge_config(m, address, passwords[f"bridge-{m}"]))
    err_console.print(f"wrote {out / 'passwd'}, {out / 'acl'}, {limits_file}, the "
                      "parameter server's and "
                      f"{len(meshes)} bridges' secrets, the push keys of meshes "
                      f"{', '.join(map(str, meshes))} and their bridge-<mesh>.conf (install "
                      f"each as {BRIDGE_DIR}/bridge-<mesh>.conf, owner mosquitto, mode "
                      f"0600, and end the building's mosquitto.conf with `include_dir "
                      f"{BRIDGE_DIR}`)", highlight=False)
    if address.tls:
        err_console.print(f"the bridges connect to {address} over TLS, checking its "
                          f"certificate against {address.cafile or 'the system CAs'}",
                          highlight=False)
    else:
        err_console.print(f"warning: the bridges connect to {address} in clear: their "
                          "password, the pushes and the weights cross the network "
                          "unencrypted (mqtts://HOST bridges over TLS)", highlight=False)


SERVER_KEYS = "ps.keys.json"  # every mesh's key of the link edge-ps
BRIDGE_DIR = "/etc/mosquitto/meshdl/bridge.d"  # where a building's Mosquitto reads it


def _limits_files(out: Path) -> list[Path]:
    """The broker limits files already in `out` (of any limit)."""
    return sorted((out / LIMITS_DIR).glob("message-size-*.conf"))


def _write_limits(out: Path, text: str, name: str) -> Path:
    """The broker's limits file, alone in out/limits.d (production.conf's include_dir):
    an older one, of another limit, goes (its place is taken with --force only)."""
    folder = out / LIMITS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    for stale in _limits_files(out):
        stale.unlink()
    _write_private(folder / name, text)
    return folder / name


def _limits_report(limits: BrokerLimits, path: Path) -> dict[str, Any]:
    return {"file": str(path), **limits.options(),
            "largest": {"kind": limits.largest.kind, "bytes": limits.largest.bytes,
                        "what": limits.largest.what},
            "mesh_max_message_bytes": limits.mesh_limit, "near_1mb": limits.near_megabyte}


def _say_limits(limits: BrokerLimits, whose: str) -> None:
    largest = limits.largest
    err_console.print(
        f"the broker takes messages of up to {limits.message_size_limit:,} bytes "
        f"({whose}'s largest: {largest.kind}, {largest.what}, {largest.bytes:,} bytes); "
        f"install {LIMITS_DIR}/ as /etc/mosquitto/meshdl/{LIMITS_DIR}/ (production.conf "
        "reads it)", highlight=False, soft_wrap=True)
    if limits.near_megabyte:
        err_console.print(
            f"warning: {whose}'s largest legitimate message is itself near 1 MB "
            f"({largest.bytes:,} bytes): the broker can refuse nothing smaller, so a "
            "stolen login may flood its neighbours with messages that large, which a "
            "loaded host checks slower than they come (a smaller [train] batch gives a "
            "tighter limit)", highlight=False, soft_wrap=True, markup=False)


def _push_files(mesh: int) -> tuple[str, str]:
    """The names of a mesh's edge's push key file and of the .env file naming it."""
    return f"push-{mesh}.keys.json", f"push-{mesh}.environment"


def _push_env(key_file: Path, auth: bool = False) -> str:
    """The lines that give a process its push key file (and turn authentication on)."""
    return ("MESHDL_MESH__AUTH=true\n" if auth else "") + \
        f"MESHDL_PARALLEL__KEYS={key_file}\n"


def _fresh_passwords(users: list[MeshUser], targets: list[Path], force: bool, out: Path,
                     secrets_dir: Path) -> dict[str, str]:
    """A new random password per user, once no file of `targets` would be overwritten
    unasked; `out` and its private `secrets_dir` made ready for them."""
    existing = [path for path in targets if path.exists()]
    if existing and not force:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise MeshdlError(f"{existing[0]} exists{more}; pass --force to overwrite "
                          "(every password changes)")
    passwords = {u.name: secrets.token_urlsafe(PASSWORD_BYTES) for u in users}
    out.mkdir(parents=True, exist_ok=True)
    _ignore_in_git(out)
    secrets_dir.mkdir(mode=0o700, exist_ok=True)
    secrets_dir.chmod(0o700)
    return passwords


def _ignore_in_git(out: Path) -> None:
    """Credentials written inside a checkout must not be committed by a `git add -A`:
    the directory ignores itself, wherever it is (an existing .gitignore is kept)."""
    ignore = out / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# written by `meshdl deploy credentials`: passwords, ACL and "
                          "message keys; never commit them\n*\n")


def _parse_hosts(specs: list[str], rows: int, cols: int) -> dict[str, list[Cell]]:
    from meshdl.mqtt.acl import parse_host

    hosts: dict[str, list[Cell]] = {}
    for spec in specs:
        try:
            name, cells = parse_host(spec, rows, cols)
        except ValueError as exc:
            raise UsageError(f"--host {spec}: {exc}") from None
        if name in hosts:
            # One rectangle per host, as `meshdl nodes run --cells` takes.
            raise UsageError(f"--host {spec}: host {name} is given twice")
        hosts[name] = cells
    return hosts


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (also when it existed with looser rights)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(text)


def _hash_passwords(tool: str, path: Path, passwords: dict[str, str]) -> None:
    """Build the password_file with mosquitto_passwd, then move it into place at once."""
    partial = path.with_name(path.name + ".partial")
    _write_private(partial, "")  # 0600 from the start: -c keeps an existing file's mode
    try:
        for i, (user, password) in enumerate(passwords.items()):
            create = ["-c"] if i == 0 else []
            # -b puts the password on the command line for a few milliseconds, on the
            # provisioning machine only; the resulting file holds hashes alone.
            result = subprocess.run(
                [tool, "-H", HASH, *create, "-b", str(partial), user, password],
                capture_output=True, text=True, check=False,
            )
            if result.returncode != 0:
                reason = (result.stderr or result.stdout).strip().splitlines()
                raise MeshdlError(f"mosquitto_passwd failed for user {user}: "
                                  f"{reason[0] if reason else f'exit {result.returncode}'}")
        partial.chmod(0o600)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


def _env_text(user: MeshUser, password: str, mesh_id: int, key_file: Path | None,
              max_message_bytes: int | None = None) -> str:
    """A systemd EnvironmentFile: the user's broker login, which cells it acts for, its
    message keys, and the broker's message size limit (every process of the mesh plans
    its waves within it: evaluation waves are cut to fit)."""
    from meshdl.mqtt.acl import format_cells

    who = {"edge": "the edge", "monitor": "the read-only monitor",
           "server": "the parameter server"}.get(user.role, f"{user.role} {user.name}")
    lines = [
        f"# meshdl mesh {mesh_id}: broker login of {who}. Keep it secret:",
        "# mode 0600, owned by the service user (see deploy/RASPBERRY_PI.md).",
        f"MESHDL_MQTT_USER={user.name}",
        f"MESHDL_MQTT_PASSWORD={password}",
    ]
    if key_file is not None:
        lines += ["MESHDL_MESH__AUTH=true", f"MESHDL_MESH__KEYS={key_file}"]
    if max_message_bytes is not None:
        lines.append(f"MESHDL_MESH__MAX_MESSAGE_BYTES={max_message_bytes}")
    if user.role == "node":
        (row, col), = user.cells
        lines.append(f"MESHDL_CELL={row},{col}")  # meshdl-node@.service: --cell
    elif user.role == "host":
        lines.append(f"MESHDL_CELLS={format_cells(user.cells)}")  # meshdl-nodes@: --cells
    return "\n".join(lines) + "\n"


def _report(out: Path, mesh_id: int, grid: tuple[int, int],
            users: list[MeshUser]) -> dict[str, Any]:
    return {
        "mesh_id": mesh_id,
        "grid": list(grid),
        "passwd": str(out / "passwd"),
        "acl": str(out / "acl"),
        "users": [
            {
                "name": u.name,
                "role": u.role,
                "cells": [list(c) for c in u.cells],
                "secrets": str(out / "secrets" / f"{u.name}.env"),
                "keys": None if u.role == "monitor" else
                str(out / "secrets" / f"{u.name}.keys.json"),
                "grants": [{"access": g.access, "topic": g.topic} for g in u.grants],
            }
            for u in users
        ],
    }
