"""Which build runs: the modules the hot path imports are the build's (extension modules when
compiled, ``.py`` files when pure), and the broker and the CLI say which.

``make test`` sets TXB_EXPECT_BUILD (``compiled`` for the whole suite, ``pure`` for the store,
protocol and crash tests run again on a copy without extension modules), so a compiled build
whose tests silently ran the pure code fails here rather than passing unnoticed.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import BrokerProcess
from txbroker import __version__
from txbroker.runtime import build
from txbroker.runtime.build import BUILD, COMPILED_MODULES, Build, detect

EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def _loaded() -> dict[str, str]:
    """Each hot-path module's file, as imported into this process."""
    return {m: str(importlib.import_module(m).__file__) for m in COMPILED_MODULES}


def test_the_expected_build_is_the_one_loaded() -> None:
    expected = os.environ.get("TXB_EXPECT_BUILD")
    if expected is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs the tests through `make test`, which sets TXB_EXPECT_BUILD")
        pytest.skip("TXB_EXPECT_BUILD is not set: no build is expected")
    loaded = _loaded()
    if expected == "compiled":
        pure = sorted(m for m, f in loaded.items() if not f.endswith(EXTENSIONS))
        assert not pure, f"these ran as Python in the compiled build: {pure}"
        assert BUILD.kind == "compiled"
        assert BUILD.compiled == COMPILED_MODULES
    elif expected == "pure":
        compiled = sorted(m for m, f in loaded.items() if not f.endswith(".py"))
        assert not compiled, f"these ran compiled in the pure build: {compiled}"
        assert BUILD.kind == "pure"
        assert BUILD.describe() == "pure Python"
    else:
        pytest.fail(f"TXB_EXPECT_BUILD is compiled or pure, not {expected!r}")


def test_the_build_found_is_the_build_imported() -> None:
    loaded = _loaded()
    assert detect() == BUILD
    assert BUILD.compiled == tuple(m for m, f in loaded.items() if f.endswith(EXTENSIONS))


def test_the_version_names_the_build() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "txbroker.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout == f"txbroker {__version__}, build: {BUILD.describe()}\n"
    if BUILD.kind == "compiled":
        assert f"compiled (mypyc, {len(COMPILED_MODULES)} modules)" in done.stdout


def test_a_broker_says_which_build_serves(broker: BrokerProcess) -> None:
    assert broker.proc is not None
    log = broker.log_path.read_text()
    assert f"txbroker {__version__}, build: {BUILD.describe()}" in log
    metrics = httpx.get(f"{broker.http}/metrics", timeout=10).text
    [target] = [line for line in metrics.splitlines() if line.startswith("target_info{")]
    assert re.search(rf'txbroker_build="{BUILD.kind}"', target), target
    assert f'service_version="{__version__}"' in target


def test_a_source_newer_than_its_compiled_module_is_stale(tmp_path: Path) -> None:
    # A package of one compiled module, its source then edited: it would import the old code.
    pkg = tmp_path / "stalepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    so = pkg / f"codec{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    so.write_bytes(b"")
    source = pkg / "codec.py"
    source.write_text("")
    os.utime(so, (1_000_000, 1_000_000))
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(build, "COMPILED_MODULES", ("stalepkg.codec",))
            found = build.detect()
            assert found == Build(("stalepkg.codec",), ("stalepkg.codec",))
            assert found.describe() == "compiled (mypyc, 1 module), stale: stalepkg.codec"
            os.utime(source, (1_000_000, 1_000_000))
            assert build.detect().stale == ()
    finally:
        sys.path.remove(str(tmp_path))
