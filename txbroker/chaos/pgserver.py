"""A private PostgreSQL server for the campaign: its own ``initdb`` in a temporary folder,
listening on a loopback port, restarted (``pg_ctl stop -m immediate``, a crash with recovery at
the next start, or ``-m fast``) under the services, and removed afterwards.

PostgreSQL refuses to run as root: as root, its commands run as the ``postgres`` user through
``runuser``, in a folder of its own under $TMPDIR (a test's temporary folder may not be
reachable by that user).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Final

from txbroker.chaos.procs import free_port

__all__ = ["PgUnavailable", "PrivatePostgres"]

PG_TIMEOUT_S: Final = 60  # start (with crash recovery) or stop, on a busy 2-core machine
# Small and safe: fsync stays on (a crash must not lose what PostgreSQL acknowledged).
SETTINGS: Final = (
    "listen_addresses = '127.0.0.1'\n"
    "max_connections = 60\n"
    "shared_buffers = 16MB\n"
    "unix_socket_directories = ''\n"
)


class PgUnavailable(Exception):
    """No PostgreSQL server binaries here, or no user to run them as."""


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if found:
        return Path(found[0]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise PgUnavailable("no initdb (Debian: apt-get install postgresql)")


class PrivatePostgres:
    """``with PrivatePostgres() as pg``: initialised and started; ``pg.url(db)`` after
    ``pg.create(db)``; stopped and removed at the end."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        self.as_user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise PgUnavailable("running as root and there is no postgres user") from None
            if shutil.which("runuser") is None:
                raise PgUnavailable("running as root and there is no runuser")
            self.as_user = "postgres"
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="txb-chaos-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.restarts = 0

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bindir / tool), *args]
        if self.as_user is not None:
            cmd = ["runuser", "-u", self.as_user, "--", *cmd]
        res = subprocess.run(
            cmd, cwd=self.root, capture_output=True, text=True, timeout=PG_TIMEOUT_S + 10
        )
        if res.returncode != 0:
            raise RuntimeError(f"{tool} failed ({res.returncode}): {res.stderr.strip()[-500:]}")

    def __enter__(self) -> PrivatePostgres:
        try:
            if self.as_user is not None:
                user = pwd.getpwnam(self.as_user)
                os.chown(self.root, user.pw_uid, user.pw_gid)
            self._run(
                "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
            )
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.write(SETTINGS + f"port = {self.port}\n")
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self.stop("fast")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def start(self) -> None:
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            str(PG_TIMEOUT_S),
            "start",
        )

    def stop(self, mode: str) -> None:
        """``immediate``: no checkpoint, the next start recovers (as after a crash)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", str(PG_TIMEOUT_S), "stop")

    def restart(self, mode: str) -> None:
        self.stop(mode)
        self.start()
        self.restarts += 1

    def create(self, database: str) -> str:
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", database)
        return self.url(database)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"
