"""Finding the JDBC driver jars Spark needs to read the services' tables.

In order: the ``--jars`` option, the ``TXBROKER_JDBC_JARS`` environment variable (both
comma-separated paths), then the jars Debian's packages installed, found with ``dpkg -L`` (the
packages' file lists) so a different path on another release is still found. ``make`` installs
the packages when they are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from typing import Final

from txbroker_reconcile.errors import CannotRun

__all__ = ["DRIVERS", "ENV", "find_jars", "jdbc_driver"]

ENV: Final = "TXBROKER_JDBC_JARS"

# dialect -> (Debian package, the jar's file name in /usr/share/java, its driver class).
DRIVERS: Final = {
    "postgresql": ("libpostgresql-jdbc-java", "postgresql.jar", "org.postgresql.Driver"),
    "sqlite": ("libxerial-sqlite-jdbc-java", "sqlite-jdbc.jar", "org.sqlite.JDBC"),
}


def jdbc_driver(dialect: str) -> str:
    return DRIVERS[dialect][2]


def _from_dpkg(package: str, jar: str) -> str | None:
    if shutil.which("dpkg") is None:
        return None
    try:
        listing = subprocess.run(
            ["dpkg", "-L", package], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in listing.splitlines():
        if line.endswith("/" + jar) and os.path.isfile(line):
            return line
    return None


def find_jars(dialects: Sequence[str], given: Sequence[str] = ()) -> list[str]:
    """The jars for ``dialects`` (postgresql, sqlite); raise :class:`CannotRun` saying how to
    install the one that is missing."""
    explicit = list(given) or [j for j in os.environ.get(ENV, "").split(",") if j]
    if explicit:
        missing = [j for j in explicit if not os.path.isfile(j)]
        if missing:
            raise CannotRun(f"JDBC jar not found: {', '.join(missing)}")
        return explicit
    jars = []
    for dialect in sorted(set(dialects)):
        package, jar, _ = DRIVERS[dialect]
        path = _from_dpkg(package, jar)
        if path is None:
            raise CannotRun(
                f"no JDBC driver for {dialect}: install Debian's {package} "
                f"(`apt-get install {package}`, which `make` does when it can), or give the "
                f"jar with --jars or ${ENV}"
            )
        jars.append(path)
    return jars
