"""The distribution a service installs: only txbroker-prefixed top-level packages, with the data
they load at run time (the Alembic scripts, the type markers), and not the repository's examples.

Built from a copy of the tracked files with the environment's own setuptools (no build
isolation, so nothing is downloaded), as a release would build it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

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


def test_the_wheel_installs_only_txbroker_packages_with_their_data(tmp_path: Path) -> None:
    src = _tracked_copy(tmp_path / "src")
    out = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "--wheel-dir", str(out), str(src)],
        check=True,
        timeout=240,
    )
    [wheel] = out.glob("txbroker-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
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
