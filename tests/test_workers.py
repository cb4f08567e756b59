"""How ``make test`` shares the tests among xdist workers (tests/conftest.py groups them)."""

from __future__ import annotations

import os

import pytest


@pytest.mark.xdist_group("a group of one")
def test_a_grouped_test_reaches_its_worker_as_one_of_its_group(
    request: pytest.FixtureRequest,
) -> None:
    # The controller learns a test's group from the "@group" its worker appends to the id; a
    # pytest and pytest-xdist that disagree on it spread every group without a word.
    if not (os.environ.get("PYTEST_XDIST_WORKER") and request.config.getvalue("loadgroup")):
        pytest.skip("runs under make test: pytest -n N --dist loadgroup")
    assert request.node.nodeid.endswith("@a group of one"), (
        f"{request.node.nodeid}: --dist loadgroup ignores xdist_group with this pytest and "
        "pytest-xdist; install the versions of pyproject.toml's test extra"
    )
