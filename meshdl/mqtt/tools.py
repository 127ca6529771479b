"""Mosquitto's programs (mosquitto, mosquitto_passwd, mosquitto_sub, ...): where they are.

`meshdl broker`, `meshdl deploy`, the private broker of the tests and benchmarks
(localbroker.py) and `meshdl bench mqtt` all find them here.
"""

from __future__ import annotations

import os
import shutil

from meshdl.errors import MeshdlError

# Debian and Raspberry Pi OS install mosquitto in /usr/sbin, which is not on an ordinary
# user's PATH; Homebrew uses its own sbin.
SBIN_DIRS: tuple[str, ...] = ("/usr/sbin", "/usr/local/sbin", "/opt/homebrew/sbin")
INSTALL_HINT = "install it with `sudo apt-get install mosquitto` (or run ./bootstrap --dev)"


def find_tool(name: str) -> str:
    """The path of a Mosquitto program (PATH first, then the sbin directories)."""
    found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN_DIRS))
    if found is None:
        raise MeshdlError(f"{name} not found (looked on PATH and in {', '.join(SBIN_DIRS)}); "
                          f"{INSTALL_HINT}")
    return found
