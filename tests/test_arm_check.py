"""deploy/arm/check-arm.sh: does meshdl install on a Raspberry Pi's CPU (issue 33 item 13)?

The script's full run (an emulated arm64 Debian training a mesh, minutes) is not part of the
suite; its output is in deploy/arm/README.md. Here: the script parses, asks pip for every
wheel tag a Pi's glibc accepts, and, only when asked (`MESHDL_ARM_CHECK=1`, on a machine
set up for ARM checks: the suite's traffic stays on loopback), its quick part asks PyPI
for the aarch64 and armv7l wheels.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "deploy" / "arm" / "check-arm.sh"


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


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MESHDL_ARM_CHECK") != "1" or
                    shutil.which("qemu-aarch64-static") is None,
                    reason="asks PyPI: only with MESHDL_ARM_CHECK=1 and qemu-aarch64-static")
def test_pypi_has_aarch64_wheels_of_numba_llvmlite_numpy_and_reports_armv7l(
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
