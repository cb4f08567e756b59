"""Every command and every option of `txbroker` says what it is for."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from tests.conftest import run_cli
from txbroker.cli import build_parser


def _walk(
    parser: argparse.ArgumentParser, path: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _walk(child, f"{path} {name}")


def _missing_help(path: str, parser: argparse.ArgumentParser) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            described = {a.dest for a in action._choices_actions if a.help}
            missing += [f"{path} {name}" for name in action.choices if name not in described]
        elif not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_subcommand_and_option_has_help() -> None:
    commands = list(_walk(build_parser(), "txbroker"))
    missing = [m for path, parser in commands for m in _missing_help(path, parser)]
    assert missing == []
    # The walk reached the leaves, not only the top level.
    paths = {path for path, _ in commands}
    assert {"txbroker group describe", "txbroker bench service", "txbroker tx list"} <= paths


def test_the_walk_finds_what_lacks_help() -> None:
    p = argparse.ArgumentParser(prog="x")
    sub = p.add_subparsers()
    child = sub.add_parser("quiet")  # no help=
    child.add_argument("--flag")  # no help=
    sub.add_parser("said", help="has help")
    found = [m for path, parser in _walk(p, "x") for m in _missing_help(path, parser)]
    assert found == ["x quiet", "x quiet --flag"]


def test_help_runs_as_a_command() -> None:
    out = run_cli("--help")
    assert out.returncode == 0 and "group" in out.stdout and "consumer groups" in out.stdout
    out = run_cli("serve", "--help")
    assert out.returncode == 0 and "--max-checks" in out.stdout and "parked" in out.stdout
