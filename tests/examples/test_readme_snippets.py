"""The README's code is the code that runs: a line ``<!-- <path> -->`` directly above a
```` ```python ```` block says the block is the file at ``<path>``, byte for byte, and the
service example (examples/shop, run end to end by tests/examples/test_shop.py) must be there.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

README = ROOT / "README.md"
# The README's service snippet: the two services a test runs end to end.
REQUIRED = ("examples/shop/orders.py", "examples/shop/billing.py")
# A marker naming a file (a path with an extension), then the fenced block on the next line.
_SNIPPET = re.compile(
    r"^<!-- (?P<path>[\w.][\w./-]*\.\w+) -->\n```python\n(?P<code>.*?)^```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)


def _snippets() -> list[tuple[str, str]]:
    text = README.read_bytes().decode()  # as stored: no newline translation
    return [(m["path"], m["code"]) for m in _SNIPPET.finditer(text)]


@pytest.mark.parametrize(("path", "code"), _snippets())
def test_a_marked_snippet_is_its_file(path: str, code: str) -> None:
    file = ROOT / path
    assert file.is_file(), f"README.md shows {path}, which does not exist"
    assert code.encode() == file.read_bytes(), (
        f"README.md's snippet of {path} differs from the file: paste the file again"
    )


def test_the_service_example_is_in_the_readme() -> None:
    shown = {path for path, _ in _snippets()}
    missing = [path for path in REQUIRED if path not in shown]
    assert not missing, (
        f"README.md must show {', '.join(missing)}: a line <!-- {missing[0]} --> directly "
        "above a ```python block holding the file"
    )


def test_markers_are_recognised() -> None:
    """The pattern itself, on a README-like text: a marked block is found whole, an unmarked
    block or a marker without a block is not a snippet."""
    text = (
        "<!-- examples/a.py -->\n```python\nx = 1\n\n```\n"
        "```python\ny = 2\n```\n"
        "<!-- examples/b.py -->\nprose\n```python\nz = 3\n```\n"
        "<!-- examples/c.py -->\n```python\n```\n"
    )
    found = [(m["path"], m["code"]) for m in _SNIPPET.finditer(text)]
    assert found == [("examples/a.py", "x = 1\n\n"), ("examples/c.py", "")]
