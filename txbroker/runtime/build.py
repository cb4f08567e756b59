"""Which build is running: pure Python, or the hot path compiled by mypyc.

The same ``.py`` files are the only source. ``make`` (or ``TXB_COMPILE=1 pip install .``)
compiles the modules of :data:`COMPILED_MODULES` with mypyc into extension modules beside them,
and Python imports an extension module in preference to its ``.py`` file; a plain
``pip install`` builds nothing and runs every module as Python (docs/operations.md, "The
compiled hot path"). setup.py reads the list from this file, so it is written once, here.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["BUILD", "COMPILED_MODULES", "Build", "detect"]

# The per-message path, chosen by profile (docs/benchmarks.md, "Compiled hot path"): the frame
# codec, the record encoding with its CRC, the consume-queue and key-index entries, the files
# they are written to, the store's append entry and its lifecycle check, and the SDK's request
# encoding and receipt decoding; and the HTTP API's publish path past the ASGI layers (the
# direct request, its endpoint and the body's decoding; not guard.py, whose endpoints Starlette
# must see as functions).
COMPILED_MODULES: Final[tuple[str, ...]] = (
    "txbroker.protocol.codec",
    "txbroker.protocol.ids",
    "txbroker.store.record",
    "txbroker.store.consumequeue",
    "txbroker.store.keyindex",
    "txbroker.store.mapped",
    "txbroker.store.commitlog",
    "txbroker.store.append",
    "txbroker.store.flush",
    "txbroker.store.state",
    "txbroker.store.store",
    "txbroker.server.producer",
    "txbroker.server.handlers",
    "txbroker.server.connection",
    "txbroker.runtime.turnwriter",
    "txbroker.runtime.httpdirect",
    "txbroker.server.http.bodies",
    "txbroker.server.http.messaging",
    "txbroker_sdk.wire",
)

_EXTENSIONS: Final = tuple(importlib.machinery.EXTENSION_SUFFIXES)


@dataclass(frozen=True, slots=True)
class Build:
    compiled: tuple[str, ...]  # the modules of COMPILED_MODULES that import as extensions
    # Compiled modules whose .py file changed after they were compiled: their edits do not run
    # until `make compiled` (Python imports the extension module whatever its age).
    stale: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        """``compiled`` or ``pure``: the ready line's ``build=`` and the ``txbroker.build``
        attribute of the metrics' resource (``target_info``'s ``txbroker_build`` label)."""
        return "compiled" if self.compiled else "pure"

    def describe(self) -> str:
        """What ``txbroker --version`` and the broker's start-up line say."""
        if not self.compiled:
            return "pure Python"
        partial = "" if len(self.compiled) == len(COMPILED_MODULES) else " (partial)"
        stale = f", stale: {', '.join(self.stale)}" if self.stale else ""
        n = len(self.compiled)
        return f"compiled (mypyc, {n} module{'s' if n != 1 else ''}){partial}{stale}"


def _origin(name: str) -> str | None:
    """The file ``import name`` would open, found without importing it or its packages (the
    broker must not import the SDK's package to learn how it was built)."""
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    for i in range(len(rest)):
        if spec is None or spec.submodule_search_locations is None:
            return None
        fullname = ".".join([top, *rest[: i + 1]])
        spec = importlib.machinery.PathFinder.find_spec(
            fullname, list(spec.submodule_search_locations)
        )
    return spec.origin if spec is not None else None


def detect() -> Build:
    """The build that importing the hot-path modules loads: which of them are extensions, and
    which of those are older than their source."""
    compiled, stale = [], []
    for m in COMPILED_MODULES:
        origin = Path(_origin(m) or "")
        if origin.name.endswith(_EXTENSIONS):
            compiled.append(m)
            source = origin.with_name(m.rsplit(".", 1)[-1] + ".py")
            if source.exists() and source.stat().st_mtime > origin.stat().st_mtime:
                stale.append(m)
    return Build(tuple(compiled), tuple(stale))


BUILD: Final = detect()
