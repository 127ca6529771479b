"""`meshdl deploy credentials`, `meshdl broker` and the production Mosquitto config.

The credentials command writes hashed passwords, a deny-by-default ACL and private
secrets files, refuses to overwrite them, and rejects bad node-host specs in one line.
`meshdl broker` runs a real broker (or says how to install one), and
deploy/mosquitto/production.conf starts under Mosquitto with TLS and logins working.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path

import aiomqtt
import pytest

from meshdl.mqtt import tools as mosquitto_tools
from meshdl.mqtt.acl import (
    Grant,
    format_cells,
    host_grants,
    node_grants,
    parse_acl,
    parse_cells,
)
from meshdl.mqtt.localbroker import production_config, stop_process
from meshdl.protocol.auth import Keyring
from meshdl.protocol.messages import EDGE
from meshdl.protocol.topics import name_of
from meshdl.protocol.topology import Topology
from tests.helpers import SMALL_MESH_TOML, TWO_MESHES_TOML, assert_one_line_error
from tests.mosquitto import free_port, mosquitto_binary, self_signed, wait_for_port

REPO = Path(__file__).resolve().parents[1]
PRODUCTION_CONF = REPO / "deploy" / "mosquitto" / "production.conf"

CELLS = [f"r{r}c{c}" for r in range(3) for c in range(4)]


@pytest.fixture
def mesh_file(tmp_path: Path) -> Path:
    path = tmp_path / "mesh.toml"
    path.write_text(SMALL_MESH_TOML)
    return path



def _env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines()
                if line and not line.startswith("#"))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _check_hash(entry: str, password: str) -> bool:
    """Verify a Mosquitto sha512-pbkdf2 entry ($7$iterations$salt$hash) independently."""
    _, kind, iterations, salt, digest = entry.split("$")
    assert kind == "7"
    derived = hashlib.pbkdf2_hmac("sha512", password.encode(), base64.b64decode(salt),
                                  int(iterations), 64)
    return derived == base64.b64decode(digest)


# --------------------------------------------------------------------------- credentials


def test_credentials_write_hashed_passwords_an_acl_and_private_secrets(
        cli, mesh_file, tmp_path) -> None:
    mosquitto_binary("mosquitto_passwd")
    out = tmp_path / "creds"
    code, stdout, err = cli("deploy", "credentials", "--mesh", mesh_file, "--out", out,
                            "--host", "floor1=1-2,0-3", "--json")
    assert code == 0, err
    report = json.loads(stdout)
    users = {u["name"]: u for u in report["users"]}
    assert set(users) == {"edge", "monitor", "floor1", *CELLS}
    assert users["floor1"]["cells"] == [[r, c] for r in (1, 2) for c in range(4)]

    hashes = dict(line.split(":", 1) for line in (out / "passwd").read_text().splitlines())
    assert set(hashes) == set(users)
    passwords = {}
    for name in users:
        env = _env(out / "secrets" / f"{name}.env")
        assert env["MESHDL_MQTT_USER"] == name
        passwords[name] = env["MESHDL_MQTT_PASSWORD"]
        assert len(passwords[name]) >= 32
        assert _check_hash(hashes[name], passwords[name])
        assert passwords[name] not in stdout + err  # never printed
        assert _mode(out / "secrets" / f"{name}.env") == 0o600
    assert len(set(passwords.values())) == len(passwords)
    assert _env(out / "secrets" / "r1c2.env")["MESHDL_CELL"] == "1,2"
    assert _env(out / "secrets" / "floor1.env")["MESHDL_CELLS"] == "1-2,0-3"
    assert _mode(out / "secrets") == 0o700
    assert _mode(out / "passwd") == 0o600 and _mode(out / "acl") == 0o600
    assert not list(out.glob("*.partial"))


def test_credentials_give_each_user_the_message_keys_of_its_own_cells_only(
        cli, mesh_file, tmp_path) -> None:
    """Authentication is on in every unit's environment; a node's key file holds its own
    links' keys, a host's its cells', only the edge's can sign, the monitor has none."""
    mosquitto_binary("mosquitto_passwd")
    out = tmp_path / "creds"
    code, stdout, err = cli("deploy", "credentials", "--mesh", mesh_file, "--out", out,
                            "--host", "floor1=1-2,0-3", "--keys-dir", "/srv/keys")
    assert code == 0, err
    secrets = out / "secrets"
    env = _env(secrets / "r1c1.env")
    assert env["MESHDL_MESH__AUTH"] == "true"
    assert env["MESHDL_MESH__KEYS"] == "/srv/keys/r1c1.keys.json"
    assert not (secrets / "monitor.keys.json").exists()
    assert "MESHDL_MESH__AUTH" not in _env(secrets / "monitor.env")
    rings = {name: Keyring.load(secrets / f"{name}.keys.json")
             for name in ("edge", "r1c1", "r0c0", "floor1")}
    for name, ring in rings.items():
        assert _mode(secrets / f"{name}.keys.json") == 0o600
        assert ring.mesh_id == 7 and ring.edge_public == rings["edge"].edge_public
    assert {name_of(c) for pair in rings["r1c1"].links for c in pair} == \
        {"r1c1", "r0c1", "r2c1", "r1c0", "r1c2"}
    assert rings["r0c0"].links[(EDGE, (0, 0))] == rings["edge"].links[(EDGE, (0, 0))]
    assert rings["floor1"].links[((1, 1), (1, 2))] == rings["r1c1"].links[((1, 1), (1, 2))]
    assert rings["edge"].edge_private is not None
    assert all(r.edge_private is None for name, r in rings.items() if name != "edge")
    for ring in rings.values():
        assert not any(key.hex() in stdout + err for key in ring.links.values())


def test_acl_grants_each_user_exactly_its_topics(cli, mesh_file, tmp_path) -> None:
    mosquitto_binary("mosquitto_passwd")
    out = tmp_path / "creds"
    code, _, err = cli("deploy", "credentials", "--mesh", mesh_file, "--out", out,
                       "--host", "floor1=1-2,0-3")
    assert code == 0, err
    text = (out / "acl").read_text()
    acl = {user: set(grants) for user, grants in parse_acl(text).items()}
    # Nothing outside a user block (those lines would apply to anonymous clients).
    lines = text.splitlines()
    first_user = next(i for i, line in enumerate(lines) if line.startswith("user "))
    assert all(line.startswith("#") or not line.strip() for line in lines[:first_user])
    assert not any(line.startswith("pattern") for line in lines)

    w, r = (lambda t: Grant("write", t)), (lambda t: Grant("read", t))
    # To any neighbour; params: a repair to a tree child that asks (a replanned tree may
    # make any neighbour a child).
    up = ("halo", "grad_halo", "gather", "scatter", "reduce", "health", "params")
    block = ("pool", "route")  # within the pooling block (2 x 2 from r0c0)

    def sends(src: str, dst: str, kinds: tuple[str, ...]) -> set[Grant]:
        return {w(f"meshdl/7/{src}/{dst}/{kind}") for kind in kinds}

    # Exact topics, no subtree: a login cannot leave retained messages on made-up ones.
    assert acl["r1c1"] == {
        w("meshdl/7/status/r1c1"),
        *sends("r1c1", "r0c1", up + block), *sends("r1c1", "r1c0", up + block),
        *sends("r1c1", "r2c1", up), *sends("r1c1", "r1c2", up),
        r("meshdl/7/r0c1/r1c1/#"), r("meshdl/7/r2c1/r1c1/#"),
        r("meshdl/7/r1c0/r1c1/#"), r("meshdl/7/r1c2/r1c1/#"),
        r("meshdl/7/edge/all/#"),
    }
    assert acl["r0c0"] == {  # the edge's neighbour also hears the edge, and answers it
        w("meshdl/7/status/r0c0"),
        *sends("r0c0", "r1c0", up + block), *sends("r0c0", "r0c1", up + block),
        *sends("r0c0", "edge", ("gather", "reduce", "health")),
        r("meshdl/7/r1c0/r0c0/#"), r("meshdl/7/r0c1/r0c0/#"), r("meshdl/7/edge/r0c0/#"),
        r("meshdl/7/edge/all/#"),
    }
    assert acl["edge"] == {
        w("meshdl/7/edge/all/params"), w("meshdl/7/edge/all/batch"),
        w("meshdl/7/edge/r0c0/scatter"), w("meshdl/7/edge/r0c0/params"),  # and its repair
        w("meshdl/7/status/edge"), w("meshdl/7/alerts"),
        r("meshdl/7/r0c0/edge/#"), r("meshdl/7/status/#"),
    }
    assert acl["monitor"] == {r("meshdl/7/status/#"), r("meshdl/7/alerts")}
    # A node host passes its own cells' messages in process: it gets their grants on
    # the links to row 0 (another user's cells) alone, and its own status, none of theirs.
    floor_cells = [f"r{r_}c{c}" for r_ in (1, 2) for c in range(4)]
    leaving = {g for cell in floor_cells for g in acl[cell]
               if g.topic.split("/")[3 if g.access == "write" else 2] in CELLS[:4]}
    assert acl["floor1"] == {w("meshdl/7/status/floor1"), r("meshdl/7/edge/all/#")} | leaving
    assert leaving == {*sends("r1c0", "r0c0", up + block), *sends("r1c1", "r0c1", up + block),
                       *sends("r1c2", "r0c2", up + block), *sends("r1c3", "r0c3", up + block),
                       *(r(f"meshdl/7/r0c{c}/r1c{c}/#") for c in range(4))}
    for cell in CELLS:  # no node writes under edge/ or as anyone else; reads only inboxes
        for grant in acl[cell]:
            assert grant.access in ("read", "write")
            if grant.access == "write":
                assert grant.topic.startswith(f"meshdl/7/{cell}/") or \
                    grant.topic == f"meshdl/7/status/{cell}"
                assert "#" not in grant.topic and "+" not in grant.topic
            else:
                assert grant.topic == "meshdl/7/edge/all/#" or \
                    grant.topic.endswith(f"/{cell}/#")


def test_hosts_run_via_the_broker_get_their_inner_links_when_asked(cli, mesh_file,
                                                                   tmp_path) -> None:
    mosquitto_binary("mosquitto_passwd")
    out = tmp_path / "creds"
    code, _, err = cli("deploy", "credentials", "--mesh", mesh_file, "--out", out,
                       "--host", "floor1=1-2,0-3", "--via-broker")
    assert code == 0, err
    acl = {user: set(grants) for user, grants in parse_acl((out / "acl").read_text()).items()}
    floor_cells = [f"r{r_}c{c}" for r_ in (1, 2) for c in range(4)]
    # Every grant of its cells but their status topics (the host writes its own).
    assert acl["floor1"] == {Grant("write", "meshdl/7/status/floor1")}.union(
        *({g for g in acl[cell] if g.topic != f"meshdl/7/status/{cell}"}
          for cell in floor_cells))


@pytest.mark.parametrize(
    ("rows", "cols", "cells", "topics"),
    [(17, 25, "0-3,0-24", 25 * 7 + 3 + 1),  # 25 links down x 7 kinds, the edge's 3, status
     (17, 25, "4-7,0-24", 50 * 7 + 1),  # 25 links up and 25 down
     (6, 8, "0-2,0-7", 8 * (7 + 2) + 3 + 1),  # rows 2 and 3 share pooling blocks
     (6, 8, "3-5,0-7", 8 * (7 + 2) + 1)],
    ids=["17x25-first-floor", "17x25-middle-floor", "6x8-top", "6x8-bottom"])
def test_a_host_login_may_write_the_links_that_leave_it_not_its_cells_union(
        rows, cols, cells, topics) -> None:
    """The README's set-ups. What a login can leave retained on the broker is (topics it
    may write) x (the message size limit): a node's at most 33 topics (4 neighbours x
    7 kinds, 2 of them in its pooling block x 2 kinds, its status); a host's were its
    cells' union (2,698 topics for 0-3,0-24: 2.6 GiB at 1 MiB, ten times the broker's
    memory_limit)."""
    topology = Topology(rows, cols, (0, 0), 2)
    host = parse_cells(cells, rows, cols)
    writes = [g for g in host_grants(7, topology, "floor", host) if g.access == "write"]
    assert len(writes) == topics
    assert max(sum(g.access == "write" for g in node_grants(7, topology, cell))
               for cell in topology.cells()) == 33


def test_credentials_refuse_to_overwrite_without_force(cli, mesh_file, tmp_path) -> None:
    mosquitto_binary("mosquitto_passwd")
    out = tmp_path / "creds"
    assert cli("deploy", "credentials", "--mesh", mesh_file, "--out", out)[0] == 0
    before = (out / "passwd").read_bytes(), _env(out / "secrets" / "r0c1.env")

    code, _, err = cli("deploy", "credentials", "--mesh", mesh_file, "--out", out)
    assert_one_line_error(code, err, 1, "exists", "--force")
    assert ((out / "passwd").read_bytes(), _env(out / "secrets" / "r0c1.env")) == before

    code, _, err = cli("deploy", "credentials", "--mesh", mesh_file, "--out", out, "--force")
    assert code == 0, err
    after = _env(out / "secrets" / "r0c1.env")["MESHDL_MQTT_PASSWORD"]
    assert after != before[1]["MESHDL_MQTT_PASSWORD"]
    r0c1 = next(line for line in (out / "passwd").read_text().splitlines()
                if line.startswith("r0c1:"))
    assert _check_hash(r0c1.split(":", 1)[1], after)


def test_cell_ranges_parse_and_format_back() -> None:
    assert parse_cells("0-1,2", 3, 4) == [(0, 2), (1, 2)]
    assert parse_cells(" 2 , 0 - 3 ", 3, 4) == [(2, 0), (2, 1), (2, 2), (2, 3)]
    assert format_cells(parse_cells("1-2,0-3", 3, 4)) == "1-2,0-3"
    assert format_cells([(2, 3)]) == "2,3"
    with pytest.raises(ValueError, match="one rectangle"):
        format_cells([(0, 0), (1, 1)])


@pytest.mark.parametrize(
    ("hosts", "needle"),
    [
        (["floor1"], "NAME=ROWS,COLS"),
        (["floor1=0-5,0"], "row 5 is outside the grid"),
        (["floor1=0,4"], "column 4 is outside the grid"),
        (["floor1=2-1,0"], "reversed"),
        (["floor1=a,b"], "not N or N-M"),
        (["floor1=0,0,0"], "ROWS,COLS"),
        (["floor1=0-,1"], "not N or N-M"),
        (["r1c1=0,0"], "taken"),
        (["edge=0,0"], "taken"),
        (["ps=0,0"], "taken"),
        (["bridge-1=0,0"], "taken"),
        (["=0,0"], "host name"),
        (["floor 1=0,0"], "host name"),
        (["a=0,0-1", "b=0,1"], "two hosts"),
        (["a=0,0", "a=1,1"], "given twice"),
    ],
    ids=["no-cells", "row-outside", "col-outside", "reversed", "garbage", "three-parts",
         "open-range", "cell-name", "reserved", "server-login", "bridge-login", "empty-name",
         "space", "overlap", "twice"],
)
def test_bad_host_specs_are_usage_errors(cli, mesh_file, tmp_path, hosts, needle) -> None:
    out = tmp_path / "creds"
    args = [arg for host in hosts for arg in ("--host", host)]
    code, _, err = cli("deploy", "credentials", "--mesh", mesh_file, "--out", out, *args)
    assert_one_line_error(code, err, 2, "--host", needle)
    assert not out.exists()


def test_credentials_without_mosquitto_passwd_say_how_to_install_it(
        cli, mesh_file, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(mosquitto_tools, "SBIN_DIRS", ())
    out = tmp_path / "creds"
    code, _, err = cli("deploy", "credentials", "--mesh", mesh_file, "--out", out)
    assert_one_line_error(code, err, 1, "mosquitto_passwd not found", "apt-get install mosquitto")
    assert not out.exists()


def test_credentials_report_a_missing_or_impossible_mesh(cli, tmp_path) -> None:
    code, _, err = cli("deploy", "credentials", "--mesh", tmp_path / "none.toml",
                       "--out", tmp_path / "creds")
    assert_one_line_error(code, err, 1, "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text(SMALL_MESH_TOML.replace("edge_at = [0, 0]", "edge_at = [1, 1]"))
    code, _, err = cli("deploy", "credentials", "--mesh", bad, "--out", tmp_path / "creds")
    assert_one_line_error(code, err, 2, "edge_at")


# --------------------------------------------------------------------------- broker


def test_broker_without_mosquitto_says_how_to_install_it(cli, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(mosquitto_tools, "SBIN_DIRS", ())
    code, _, err = cli("broker", "--port", "18830")
    assert_one_line_error(code, err, 1, "mosquitto not found", "sudo apt-get install mosquitto",
                    "./bootstrap --dev")


def test_broker_port_needs_a_config_with_one_listener(cli, tmp_path) -> None:
    mosquitto_binary()
    conf = tmp_path / "two.conf"
    conf.write_text("listener 1883 127.0.0.1\nlistener 8883\nallow_anonymous true\n")
    code, _, err = cli("broker", "--config", conf, "--port", "18830")
    assert_one_line_error(code, err, 2, "exactly one `listener`")
    code, _, err = cli("broker", "--config", tmp_path / "absent.conf")
    assert_one_line_error(code, err, 1, "absent.conf")


def test_broker_serves_mqtt_on_the_given_port_until_stopped(tmp_path) -> None:
    mosquitto_binary()
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", "from meshdl.cli import main; main()", "broker", "--port",
         str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
    )
    try:
        wait_for_port("127.0.0.1", port, timeout=20, process=process)

        async def round_trip() -> bytes:
            async with aiomqtt.Client("127.0.0.1", port, timeout=5) as client:
                await client.subscribe("meshdl/test", qos=1)
                await client.publish("meshdl/test", b"hello", qos=1)
                async for message in client.messages:
                    return bytes(message.payload)
            raise AssertionError("no message")

        assert asyncio.run(asyncio.wait_for(round_trip(), 10)) == b"hello"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err.decode()
    assert f"mosquitto on 127.0.0.1:{port}" in err.decode()


# --------------------------------------------------------------------------- production


def _production_variant(tmp: Path, tls_port: int, local_port: int) -> str:
    """production.conf with its paths under `tmp`, free ports, and this user."""
    return production_config(tmp, tls_port, local_port)




def _wait_for_tls(port: int, tls: ssl.SSLContext, timeout: float) -> None:
    """Until a TLS handshake on `port` succeeds, then close it properly: a bare TCP
    probe would make the broker log an OpenSSL error (an EOF inside the handshake)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as raw, \
                    tls.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                sock.unwrap()  # close_notify: an orderly end for the broker
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_production_config_starts_with_tls_and_logins(cli, mesh_file, tmp_path) -> None:
    binary = mosquitto_binary()
    mosquitto_binary("mosquitto_passwd")
    self_signed(tmp_path / "meshdl" / "tls")
    code, _, err = cli("deploy", "credentials", "--mesh", mesh_file, "--out",
                       tmp_path / "meshdl")
    assert code == 0, err
    (tmp_path / "data").mkdir()
    tls_port, local_port = free_port(), free_port()
    conf = tmp_path / "production-test.conf"
    conf.write_text(_production_variant(tmp_path, tls_port, local_port))
    edge_password = _env(tmp_path / "meshdl" / "secrets" / "edge.env")["MESHDL_MQTT_PASSWORD"]
    log = tmp_path / "mosquitto.log"

    with open(log, "wb") as log_fh:
        process = subprocess.Popen([binary, "-c", str(conf)], stdout=log_fh,
                                   stderr=subprocess.STDOUT)
    tls = ssl.create_default_context(cafile=str(tmp_path / "meshdl" / "tls" / "ca.crt"))
    try:
        wait_for_port("127.0.0.1", local_port, timeout=10, process=process)
        _wait_for_tls(tls_port, tls, timeout=10)

        async def check() -> None:
            # TLS: the certificate verifies, the edge logs in and may publish its alerts.
            async with aiomqtt.Client("127.0.0.1", tls_port, username="edge",
                                      password=edge_password, tls_context=tls,
                                      timeout=5) as edge:
                await edge.publish("meshdl/7/alerts", b"{}", qos=1)
            # Loopback: a password is still required.
            with pytest.raises(aiomqtt.MqttError, match=r"[Nn]ot authori[sz]ed"):
                async with aiomqtt.Client("127.0.0.1", local_port, timeout=5):
                    pass
            async with aiomqtt.Client("127.0.0.1", local_port, username="edge",
                                      password=edge_password, timeout=5):
                pass

        asyncio.run(asyncio.wait_for(check(), 20))
    finally:
        stop_process(process, timeout=10)
    text = log.read_text(errors="replace")
    assert process.returncode == 0, text
    assert "Error" not in text, text
    assert (tmp_path / "data" / "mosquitto.db").exists()  # persistence saved at shutdown


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_units_pass_systemd_analyze_verify(tmp_path) -> None:
    """The units parse, every directive is known, and they are notify services with a
    watchdog; the only complaint allowed is that meshdl is not installed in /opt here."""
    units = Path(__file__).parent.parent / "deploy" / "systemd"
    names = {"meshdl-edge.service": "meshdl-edge.service",
             "meshdl-node@.service": "meshdl-node@r0c1.service",
             "meshdl-nodes@.service": "meshdl-nodes@floor1.service"}
    for source, instance in names.items():
        text = (units / source).read_text()
        assert "Type=notify" in text and "WatchdogSec=" in text, source
        (tmp_path / instance).write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", *names.values()], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and "/opt/meshdl/.venv/bin/meshdl" not in line]
    assert not problems, "\n".join(problems)


def test_credentials_written_inside_a_checkout_are_ignored_by_git(cli, mesh_file,
                                                                  tmp_path) -> None:
    mosquitto_binary("mosquitto_passwd")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    code, _, err = cli("deploy", "credentials", "--mesh", mesh_file, "--out",
                       checkout / "secrets")
    assert code == 0, err
    assert len(list((checkout / "secrets" / "secrets").glob("*.env"))) > 1
    status = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain",
                             "--untracked-files=all"], capture_output=True, text=True,
                            check=True).stdout
    assert status == ""  # nothing a `git add -A` would pick up


# --------------------------------------------------------------------------- central


@pytest.fixture
def two_meshes_file(tmp_path: Path) -> Path:
    path = tmp_path / "mesh1.toml"
    path.write_text(TWO_MESHES_TOML.format(mesh_id=1))
    return path


def _bridge_lines(cli, mesh_file: Path, out: Path, *central: str) -> tuple[list[str], str]:
    mosquitto_binary("mosquitto_passwd")
    code, _, err = cli("deploy", "central", "--mesh", mesh_file, "--out", out, *central)
    assert code == 0, err
    text = (out / "bridge-1.conf").read_text()
    return [line for line in text.splitlines() if not line.startswith("#")], err


@pytest.mark.parametrize(
    ("central", "address", "ca_line"),
    [
        (["--central", "mqtts://hq.example", "--central-ca", "/etc/mosquitto/ca/hq.crt"],
         "hq.example:8883", "bridge_cafile /etc/mosquitto/ca/hq.crt"),
        (["--central", "hq.example:8883"], "hq.example:8883", "bridge_capath /etc/ssl/certs"),
        (["--central", "hq.example:9883", "--central-ca", "/etc/ca.crt"], "hq.example:9883",
         "bridge_cafile /etc/ca.crt"),
    ],
    ids=["mqtts-url-with-ca", "port-8883-system-cas", "ca-on-another-port"])
def test_a_bridge_to_a_tls_central_broker_is_written_with_tls(
        cli, two_meshes_file, tmp_path, central, address, ca_line) -> None:
    lines, err = _bridge_lines(cli, two_meshes_file, tmp_path / "hq", *central)
    assert f"address {address}" in lines
    # Without a CA Mosquitto's bridge speaks MQTT in clear to the TLS listener, which
    # refuses it ("wrong version number"); the name is checked, at TLS 1.2 or later.
    assert ca_line in lines
    assert "bridge_insecure false" in lines and "bridge_tls_version tlsv1.2" in lines
    assert "over TLS" in err and "warning" not in err


def test_a_bridge_in_clear_is_written_only_when_asked_and_with_a_warning(
        cli, two_meshes_file, tmp_path) -> None:
    lines, err = _bridge_lines(cli, two_meshes_file, tmp_path / "hq", "--central",
                               "mqtt://hq.example")
    assert "address hq.example:1883" in lines
    assert not any(line.startswith("bridge_") for line in lines)
    assert "warning: the bridges connect to mqtt://hq.example:1883 in clear" in err


@pytest.mark.parametrize(
    ("central", "needle"),
    [(["--central", "hq.example"], "HOST:PORT"),
     (["--central", "ws://hq.example:8883"], "HOST:PORT"),
     (["--central", "hq.example:0"], "HOST:PORT"),
     (["--central", "mqtt://hq.example", "--central-ca", "/etc/ca.crt"], "in clear")],
    ids=["no-port", "other-scheme", "port-0", "clear-with-ca"])
def test_a_bad_central_address_is_a_usage_error(cli, two_meshes_file, tmp_path, central,
                                                needle) -> None:
    code, _, err = cli("deploy", "central", "--mesh", two_meshes_file, "--out",
                       tmp_path / "hq", *central)
    assert_one_line_error(code, err, 2, "--central", needle)
    assert not (tmp_path / "hq").exists()
