"""`./bootstrap --dev` installs only what is missing, quietly, and never upgrades a system
package (issue 33, item 10). It runs here against stand-ins: a PATH holding the few
programs it uses and fake `apt-get` (which logs its calls, answers a simulation with a
given plan and prints dpkg-like noise when it installs) and `.venv/bin/python` (pip)."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("bash", "env", "dirname", "sed", "tr", "grep", "id", "cat")

FAKE_APT = """#!/bin/sh
echo "apt-get $*" >> "$STUB_LOG"
case "$*" in
  "install -s "*) cat "$STUB_PLAN" ;;
  install*) i=0; while [ $i -lt 500 ]; do echo "Unpacking libfoo$i (1.0) ..."; i=$((i+1)); done ;;
esac
"""
FAKE_PYTHON = """#!/bin/sh
echo "python $*" >> "$STUB_LOG"
case "$*" in
  *"import torch"*) exit 1 ;;
  *"meshdl.__version__"*) echo 0.1.0 ;;
esac
"""
FAKE_SUDO = '#!/bin/sh\nexec "$@"\n'
NEW_PACKAGES = "Inst mosquitto (2.0.11-1.2 Debian:12 [amd64])\n" \
    "Inst libcjson1 (1.7.15-1 Debian:12 [amd64])\nConf mosquitto (2.0.11-1.2)\n"
AN_UPGRADE = "Inst libudev1 [252.38-1~deb12u1] (252.39-1~deb12u2 Debian:12 [amd64])\n" \
    "Inst udev (252.39-1~deb12u2 Debian:12 [amd64])\n"


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _bootstrap(tmp_path: Path, plan: str, tools: tuple[str, ...] = ()
               ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run a copy of ./bootstrap --dev with the fakes; (the run, apt-get's calls)."""
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    (repo / ".venv" / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    shutil.copy(ROOT / "bootstrap", repo / "bootstrap")
    python = repo / ".venv" / "bin" / "python"
    _script(python, FAKE_PYTHON)
    for tool in TOOLS:
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"{tool} not found")
        (bin_dir / tool).symlink_to(found)
    _script(bin_dir / "apt-get", FAKE_APT)
    _script(bin_dir / "sudo", FAKE_SUDO)
    for tool in tools:  # present already
        _script(bin_dir / tool, "#!/bin/sh\n")
    (tmp_path / "plan").write_text(plan)
    log = tmp_path / "calls.log"
    log.touch()
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "PYTHON": str(python),
           "STUB_LOG": str(log), "STUB_PLAN": str(tmp_path / "plan"), "PIP_FIND_LINKS": "",
           "BOOTSTRAP_SBIN_DIRS": ""}
    run = subprocess.run([str(bin_dir / "bash"), str(repo / "bootstrap"), "--dev"],
                         capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    apt = [line for line in log.read_text().splitlines() if line.startswith("apt-get ")]
    return run, apt


def _installs(apt: list[str]) -> list[str]:
    return [call for call in apt if call.startswith("apt-get install") and " -s " not in call]


def test_bootstrap_dev_installs_what_is_missing_in_one_line_a_step_and_upgrades_nothing(
        tmp_path) -> None:
    run, apt = _bootstrap(tmp_path, NEW_PACKAGES)
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert "Unpacking" not in run.stderr and len(lines) <= 6, run.stderr
    assert all(line.startswith(("bootstrap: ", "meshdl is set up")) for line in lines)
    installs = _installs(apt)
    assert [call.split()[-2:] for call in installs] == [["mosquitto", "mosquitto-clients"],
                                                        ["chromium", "chromium-driver"]]
    assert all("--no-upgrade" in call and "--no-install-recommends" in call
               for call in installs)
    assert not [call for call in apt if call.split()[1] in ("upgrade", "dist-upgrade",
                                                              "full-upgrade")]
    assert "mosquitto: installed mosquitto mosquitto-clients (2 packages" in run.stderr
    assert (tmp_path / "repo" / ".venv" / "bootstrap.log").read_text().count("Unpacking") \
        == 1000  # apt's output, kept for whoever wants it


def test_bootstrap_installs_nothing_that_would_upgrade_a_system_package(tmp_path) -> None:
    run, apt = _bootstrap(tmp_path, AN_UPGRADE)
    assert run.returncode == 0, run.stderr
    assert _installs(apt) == []
    assert "would upgrade installed packages (libudev1)" in run.stderr


def test_bootstrap_leaves_apt_alone_when_the_tools_are_there(tmp_path) -> None:
    run, apt = _bootstrap(tmp_path, NEW_PACKAGES, tools=("mosquitto", "chromium",
                                                          "chromedriver"))
    assert run.returncode == 0, run.stderr
    assert apt == []
    assert "mosquitto: found" in run.stderr and "chromium: found" in run.stderr

