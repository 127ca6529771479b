"""deploy/arm/check-arm.sh: does meshdl install on a Raspberry Pi's CPU (issue 33 item 13)?

The script's full run (an emulated arm64 Debian training a mesh, minutes) is not part of the
suite; its output is in deploy/arm/README.md. Here: the script parses, asks pip for every
wheel tag a Pi's glibc accepts, asks the package indexes this machine is configured with
(issue 48: pip's own index unless ARM_INDEX_URL is given, debootstrap's own mirror unless
ARM_MIRROR is given), names the setting of an index it cannot reach, and, only when asked
(`MESHDL_ARM_CHECK=1`, on a machine set up for ARM checks: the suite's traffic stays on
loopback), its quick part asks the configured index for the aarch64 and armv7l wheels.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ARM_DIR = Path(__file__).resolve().parent.parent / "deploy" / "arm"
SCRIPT = ARM_DIR / "check-arm.sh"

# Settings that could send the script's pip anywhere but where a test points it.
_OUTSIDE = ("ARM_INDEX_URL", "ARM_MIRROR", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL",
            "PIP_FIND_LINKS", "PIP_NO_INDEX", "http_proxy", "https_proxy", "all_proxy",
            "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def _hermetic_env(tmp_path: Path, **env: str) -> dict[str, str]:
    """This machine's environment without its pip configuration, proxies or indexes."""
    base = {k: v for k, v in os.environ.items() if k not in _OUTSIDE}
    return {**base, "PIP_CONFIG_FILE": os.devnull, "ARM_WORK": str(tmp_path / "arm"), **env}


@pytest.fixture
def refused_url() -> Iterator[str]:
    """An index URL on a loopback port that is bound but never listens: connecting to it is
    refused at once, and no other process can take the port while the test holds it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/simple"


def _fake_tool(bin_dir: Path, name: str, record: Path, stdout: str = "") -> None:
    """An executable that writes its arguments, one a line, to `record`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f'#!/bin/sh\nprintf \'%s\\n\' "$@" > "{record}"\necho "{stdout}"\n')
    tool.chmod(0o755)


def _bash(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env}, check=False)


def test_arm_check_script_is_valid_bash_and_explains_itself() -> None:
    assert _bash(f"bash -n {SCRIPT}").returncode == 0
    usage = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True,
                           timeout=60, check=False)
    assert usage.returncode == 0
    assert "--quick" in usage.stdout and "armv7l" in usage.stdout


def test_wheel_platforms_cover_every_manylinux_tag_a_bookworm_pi_accepts() -> None:
    # pip takes --platform literally: numba's aarch64 wheel is tagged manylinux_2_27/2_28,
    # so asking for manylinux_2_36 alone (the Pi's glibc) finds no wheel at all.
    out = _bash(f"source {SCRIPT}; platform_args aarch64", ARM_GLIBC_MINOR="36").stdout.split()
    platforms = set(out[1::2])
    assert set(out[0::2]) == {"--platform"}
    assert {f"manylinux_2_{minor}_aarch64" for minor in range(17, 37)} <= platforms
    assert {"manylinux2014_aarch64", "linux_aarch64"} <= platforms
    assert "manylinux_2_37_aarch64" not in platforms  # newer than the Pi's glibc


def test_unreachable_index_is_named_by_its_variable_and_exits_2(
        tmp_path: Path, refused_url: str) -> None:
    run = subprocess.run(["bash", str(SCRIPT), "--quick"], capture_output=True, text=True,
                         timeout=120, check=False,
                         env=_hermetic_env(tmp_path, PIP_INDEX_URL=refused_url))
    assert run.returncode == 2, run.stdout + run.stderr
    (line,) = run.stdout.splitlines()
    assert line.split()[:3] == ["index", "SKIP:", "unreachable:"]
    assert f"PIP_INDEX_URL={refused_url}" in line
    assert "Connection refused" in line  # pip's own reason, not a guess


def test_arm_index_url_replaces_pips_index_and_is_named(
        tmp_path: Path, refused_url: str) -> None:
    run = subprocess.run(["bash", str(SCRIPT), "--quick"], capture_output=True, text=True,
                         timeout=120, check=False,
                         env=_hermetic_env(tmp_path, PIP_INDEX_URL=refused_url,
                                           ARM_INDEX_URL=refused_url + "2"))
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"ARM_INDEX_URL={refused_url}2" in run.stdout
    assert "PIP_INDEX_URL" not in run.stdout


def test_index_login_is_not_printed(tmp_path: Path, refused_url: str) -> None:
    with_login = refused_url.replace("http://", "http://reader:s3cret@")
    run = subprocess.run(["bash", str(SCRIPT), "--quick"], capture_output=True, text=True,
                         timeout=120, check=False,
                         env=_hermetic_env(tmp_path, PIP_INDEX_URL=with_login))
    assert run.returncode == 2
    assert "s3cret" not in run.stdout + run.stderr and "PIP_INDEX_URL=" in run.stdout


def test_wheel_check_asks_pips_configured_index_unless_arm_index_url(tmp_path: Path) -> None:
    venv, record = tmp_path / "venv", tmp_path / "pip-args"
    _fake_tool(venv / "bin", "pip", record, stdout="Saved ./numba-1-cp311-cp311-x.whl")
    code = f"source {SCRIPT}; wheel_for aarch64 numba==1"
    configured = _bash(code, **_hermetic_env(tmp_path, MESHDL_VENV=str(venv)))
    assert configured.stdout.strip() == "numba-1-cp311-cp311-x.whl", configured.stderr
    args = record.read_text().splitlines()
    assert args[0] == "download" and "numba==1" in args
    assert "--index-url" not in args and "--isolated" not in args  # pip's own index

    chosen = "http://127.0.0.1:9/simple"
    _bash(code, **_hermetic_env(tmp_path, MESHDL_VENV=str(venv), ARM_INDEX_URL=chosen))
    args = record.read_text().splitlines()
    assert args[args.index("--index-url") + 1] == chosen


def test_debootstrap_gets_a_mirror_only_from_arm_mirror(tmp_path: Path) -> None:
    bin_dir, record = tmp_path / "bin", tmp_path / "debootstrap-args"
    _fake_tool(bin_dir, "debootstrap", record)
    path = f"{bin_dir}:{os.environ['PATH']}"
    rootfs = tmp_path / "arm" / "rootfs-arm64"
    rootfs.parent.mkdir()  # main() makes $ARM_WORK before make_rootfs logs into it
    code = f"source {SCRIPT}; make_rootfs"
    _bash(code, **_hermetic_env(tmp_path, PATH=path))
    assert record.read_text().splitlines()[-2:] == ["bookworm", str(rootfs)]  # its default

    mirror = "http://127.0.0.1:9/debian"
    (rootfs / ".meshdl-rootfs-ok").unlink(missing_ok=True)
    _bash(code, **_hermetic_env(tmp_path, PATH=path, ARM_MIRROR=mirror))
    assert record.read_text().splitlines()[-3:] == ["bookworm", str(rootfs), mirror]


def test_arm_files_name_no_package_index_host() -> None:
    # The indexes are the machine's: a URL in these files could only be a host it may not
    # use. Loopback (an example of an unreachable index) is nobody's registry.
    hosts = {f"{path.name}: {host}" for path in ARM_DIR.iterdir() if path.is_file()
             for host in re.findall(r"https?://(?:[^/@\s]*@)?([^/:\s`'\")]+)", path.read_text())}
    assert {h for h in hosts if h.split(": ")[1] not in {"127.0.0.1", "localhost"}} == set()


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MESHDL_ARM_CHECK") != "1" or
                    shutil.which("qemu-aarch64-static") is None,
                    reason="asks the package index: only with MESHDL_ARM_CHECK=1 and "
                           "qemu-aarch64-static")
def test_configured_index_has_aarch64_wheels_of_numba_llvmlite_numpy_and_reports_armv7l(
        tmp_path: Path) -> None:
    run = subprocess.run(["bash", str(SCRIPT), "--quick"], capture_output=True, text=True,
                         timeout=900, env={**os.environ, "ARM_WORK": str(tmp_path)}, check=False)
    if run.returncode == 2:
        pytest.skip(f"could not check: {run.stdout.strip()}")
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    aarch64 = next(line for line in lines if "aarch64" in line)
    assert aarch64.split()[:2] == ["wheels", "ok:"]
    assert all(name in aarch64 for name in ("numba==", "llvmlite==", "numpy=="))
    assert any(line.startswith("wheels") and "armv7l" in line for line in lines)
