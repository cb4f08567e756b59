"""The compiled hot path, optional: ``TXB_COMPILE=1`` compiles txbroker.runtime.build's
COMPILED_MODULES with mypyc into extension modules beside their ``.py`` files (``make compiled``
in place, or a platform wheel); without it the build is pure Python. Everything else about the
package is in pyproject.toml."""

from __future__ import annotations

import ast
import os
import tomllib
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
# The mypy that compiles: its mypyc must understand the annotations mypy checks them with.
MYPYC = "mypy>=1.10"


def _compiled_modules() -> list[str]:
    """COMPILED_MODULES, read from its one home without importing the package (its
    dependencies need not be installed in a build environment)."""
    tree = ast.parse((HERE / "txbroker" / "runtime" / "build.py").read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "COMPILED_MODULES"
        ):
            assert node.value is not None
            return list(ast.literal_eval(node.value))
    raise RuntimeError("txbroker/runtime/build.py has no COMPILED_MODULES")


def _path(module: str) -> str:
    top, *rest = module.split(".")
    root = "sdk/" if top == "txbroker_sdk" else ""
    return root + "/".join([top, *rest]) + ".py"


if os.environ.get("TXB_COMPILE") == "1":
    try:
        from mypyc.build import mypycify
    except ImportError:
        # The build frontend's first pass (get_requires_for_build_wheel) asks what to install:
        # mypyc type-checks the modules against the packages they import, so those too.
        project = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]
        extras = project["optional-dependencies"]
        needs = [MYPYC, *project["dependencies"], *extras["sdk"], *extras["otel"]]
        setup(setup_requires=needs)
        raise
    # mypyc type-checks what the modules import: the packages under the design card's folders.
    os.environ["MYPYPATH"] = os.pathsep.join(
        str(HERE / d) for d in ("sdk", "checkback", "outbox", "migrations", "spark_reconcile")
    )
    # separate: each module's code in its own library beside it (``record__mypyc…so``), where
    # an editable install finds it and from which mypyc derives the right ``__file__``; one
    # library for all would sit at the top of site-packages, off the path of an editable install.
    ext_modules = mypycify([_path(m) for m in _compiled_modules()], opt_level="3", separate=True)
    setup(ext_modules=ext_modules)
else:
    setup()
