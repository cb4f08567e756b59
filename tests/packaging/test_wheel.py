"""The distribution a service installs: only txbroker-prefixed top-level packages, with the data
they load at run time (the Alembic scripts, the type markers), and not the repository's examples.

Built from a copy of the tracked files with the environment's own setuptools (no build
isolation, so nothing is downloaded), as a release would build it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from txbroker.runtime.build import COMPILED_MODULES

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "txbroker",
    "txbroker_sdk",
    "txbroker_checkback",
    "txbroker_outbox",
    "txbroker_migrations",
    "txbroker_reconcile",
}


def _tracked_copy(dest: Path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / name.decode()
        if src.is_file():  # a file deleted in the work tree but not yet in the index is skipped
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def _wheel(tmp_path: Path, env: dict[str, str], timeout_s: float) -> Path:
    src = _tracked_copy(tmp_path / "src")
    out = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "--wheel-dir", str(out), str(src)],
        check=True,
        timeout=timeout_s,
        env={**os.environ, **env},
    )
    [wheel] = out.glob("txbroker-*.whl")
    return wheel


def test_the_wheel_installs_only_txbroker_packages_with_their_data(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, {"TXB_COMPILE": ""}, 240)
    assert wheel.name.endswith("-py3-none-any.whl")  # pure: no compiler, any platform
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".so")]
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == PACKAGES, f"unexpected top-level names: {sorted(top - PACKAGES)}"
    assert not any(n.startswith(("examples/", "tests/", "migrations/", "sdk/")) for n in names)
    assert "txbroker_migrations/env.py" in names
    assert "txbroker_migrations/script.py.mako" in names
    assert any(n.startswith("txbroker_migrations/versions/0001_") for n in names)
    # The console renders these at run time: every template and the stylesheet ship.
    console = ROOT / "txbroker" / "console"
    for f in [*console.glob("templates/*.html"), console / "static" / "console.css"]:
        assert f"txbroker/console/{f.relative_to(console).as_posix()}" in names, f
    for pkg in PACKAGES - {"txbroker_migrations"}:
        assert f"{pkg}/py.typed" in names, f"{pkg} ships no py.typed"
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text  # the SPDX form, not the deprecated table


@pytest.mark.timeout(900)  # mypyc checks and gcc compiles: a minute of CPU, more when loaded
def test_the_compiled_wheel_holds_the_listed_modules_compiled(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, {"TXB_COMPILE": "1"}, 900)
    assert re.search(r"-cp3\d+-cp3\d+-linux_x86_64\.whl$", wheel.name), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    extensions = {n.split(".", 1)[0].replace("/", ".") for n in names if n.endswith(".so")}
    # Each module: its extension, and the library with its code (mypyc's separate compilation).
    assert extensions == {*COMPILED_MODULES, *(f"{m}__mypyc" for m in COMPILED_MODULES)}
    # The sources ship too: the same files, readable in tracebacks and by type checkers.
    for module in COMPILED_MODULES:
        assert module.replace(".", "/") + ".py" in names
