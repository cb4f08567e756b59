"""What a reconciliation run is asked to do: the command line, parsed and checked once.

``txbroker reconcile`` and ``spark-submit spark_reconcile/job.py`` take the same arguments
(:func:`parser`), so the command documented for one works for the other.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from txbroker_reconcile.errors import CannotRun

__all__ = [
    "DESCRIPTION",
    "JobOptions",
    "LogSpec",
    "ServiceSpec",
    "add_arguments",
    "options_from",
    "parse_args",
    "parse_duration",
    "parser",
]

_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,126}")
_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?")
_UNIT_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_COLUMN: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """One service database: its name in the report, its URL (SQLAlchemy style, as the SDK and
    ``txbroker db upgrade`` take it), the namespace its outbox relay uses in idempotency keys,
    and effect columns (``table.column`` holding one value per applied message)."""

    name: str
    url: str
    outbox_namespace: str
    effects: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class LogSpec:
    """One broker group's commit log: its name in the report and state (``""`` for the one
    log of a single broker), and the broker's data directory or a Parquet export of it."""

    group: str
    path: Path

    def shown(self) -> str:
        """As the command line gave it: ``--log DIR`` or ``--log GROUP=DIR``."""
        return f"{self.group}={self.path}" if self.group else str(self.path)


@dataclass(frozen=True, slots=True)
class JobOptions:
    """``log`` is the one log of a single broker (its records' ``broker_group`` is ``""``),
    ``logs`` the logs of several broker groups, read as one; give one or the other."""

    services: tuple[ServiceSpec, ...]
    log: Path | None
    out: Path
    grace_s: float = 60.0
    master: str = "local[*]"
    state: Path | None = None
    every_s: float | None = None
    json: bool = False
    jars: tuple[str, ...] = ()
    examples: int = 20
    # The instant "past the grace" is measured from; None means the time the run starts.
    as_of_ms: int | None = None
    shuffle_partitions: int | None = None
    progress: bool = True
    logs: tuple[LogSpec, ...] = ()

    def __post_init__(self) -> None:
        assert self.log is None or not self.logs, "give log (one broker) or logs (groups)"
        groups = [spec.group for spec in self.logs]
        assert all(groups) and len(set(groups)) == len(groups), groups

    @property
    def log_specs(self) -> tuple[LogSpec, ...]:
        """Every log to read, one per broker group."""
        return (LogSpec("", self.log),) if self.log is not None else self.logs


def parse_duration(text: str, what: str) -> float:
    """``500ms``, ``30s``, ``5m``, ``1h`` or a bare number of seconds, as seconds."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise CannotRun(f"{what}: {text!r} is not a duration (examples: 500ms, 30s, 5m, 1h)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def _pairs(values: Sequence[str] | None, option: str) -> list[tuple[str, str]]:
    out = []
    for raw in values or ():
        name, sep, value = raw.partition("=")
        if not sep or not _NAME.fullmatch(name) or not value:
            raise CannotRun(f"{option} {raw!r}: expected NAME=VALUE, e.g. {option} orders=...")
        out.append((name, value))
    return out


DESCRIPTION: Final = (
    "Reconcile services' local-transaction, outbox and inbox tables against the broker's "
    "commit log with Spark: lost, phantom, duplicate and stuck messages and latency per topic. "
    "Exit 0 = clean, 1 = anomalies found, 2 = could not run."
)


def parser(prog: str = "txbroker reconcile") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The job's options, on ``p`` (the job's own parser, or `txbroker reconcile`'s)."""
    p.add_argument(
        "--service",
        action="append",
        metavar="NAME=URL",
        required=True,
        help="a service database, e.g. orders=postgresql://user@host/db or "
        "billing=sqlite:///billing.db (repeat for each service)",
    )
    p.add_argument(
        "--log",
        action="append",
        metavar="[GROUP=]DIR",
        help="the broker's data directory (or its commitlog/ folder), or a Parquet export "
        "made by `txbroker log export`; with several broker groups, one GROUP=DIR per group "
        "(repeat the option)",
    )
    p.add_argument("--out", metavar="DIR", required=True, help="where the report is written")
    p.add_argument(
        "--grace",
        default="60s",
        help="how old something must be before it counts as lost or stuck (default 60s)",
    )
    p.add_argument(
        "--master",
        default="local[*]",
        help="Spark master (default local[*]; ignored under spark-submit, which sets it)",
    )
    p.add_argument(
        "--state",
        metavar="DIR",
        help="keep a watermark here: a rerun reads only what is new and merges it",
    )
    p.add_argument(
        "--every",
        metavar="DURATION",
        help="keep reconciling at this interval (needs --state), rewriting the summary",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument(
        "--jars",
        metavar="PATHS",
        help="comma-separated JDBC driver jars (default: $TXBROKER_JDBC_JARS, else the jars "
        "of Debian's libpostgresql-jdbc-java and libxerial-sqlite-jdbc-java)",
    )
    p.add_argument(
        "--examples",
        type=int,
        default=20,
        metavar="N",
        help="example ids kept per anomaly kind and topic (default 20)",
    )
    p.add_argument(
        "--namespace",
        action="append",
        metavar="SERVICE=NS",
        help="the outbox namespace a service's relay uses (default: the service name)",
    )
    p.add_argument(
        "--effect",
        action="append",
        metavar="SERVICE=TABLE.COLUMN",
        help="a column holding one value per message a consumer applied (for example an "
        "invoice's order id): a value found twice is a duplicate effect",
    )
    p.add_argument(
        "--shuffle-partitions",
        type=int,
        metavar="N",
        help="spark.sql.shuffle.partitions (default: 4 per core, at least 4)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")


def _logs(values: Sequence[str] | None) -> tuple[Path | None, tuple[LogSpec, ...]]:
    """``--log DIR`` (one broker) or ``--log GROUP=DIR`` once per broker group.
    A value is GROUP=DIR when what precedes its first ``=`` is a group name (no ``/``)."""
    if not values:
        return None, ()
    specs = []
    for raw in values:
        name, sep, path = raw.partition("=")
        if sep and _NAME.fullmatch(name):
            if not path:
                raise CannotRun(f"--log {raw!r}: expected GROUP=DIR, e.g. --log g1=/export/g1")
            specs.append(LogSpec(name, Path(path)))
        else:
            specs.append(LogSpec("", Path(raw)))
    if len(specs) == 1 and not specs[0].group:
        return specs[0].path, ()
    unnamed = [s.path for s in specs if not s.group]
    if unnamed:
        raise CannotRun(
            f"--log {unnamed[0]}: with several logs, name each one's broker group: "
            "--log g1=DIR --log g2=DIR"
        )
    seen: set[str] = set()
    for spec in specs:
        if spec.group in seen:
            raise CannotRun(f"--log {spec.group} is given twice")
        seen.add(spec.group)
    return None, tuple(specs)


def parse_args(argv: Sequence[str] | None = None, prog: str = "txbroker reconcile") -> JobOptions:
    return options_from(parser(prog).parse_args(argv))


def options_from(args: argparse.Namespace) -> JobOptions:
    """Check the parsed options and build the job's; raise :class:`CannotRun` saying what is
    wrong."""
    namespaces = dict(_pairs(args.namespace, "--namespace"))
    effects: dict[str, list[tuple[str, str]]] = {}
    for service, column in _pairs(args.effect, "--effect"):
        m = _COLUMN.fullmatch(column)
        if m is None:
            raise CannotRun(f"--effect {service}={column}: expected TABLE.COLUMN")
        effects.setdefault(service, []).append((m.group(1), m.group(2)))
    services: list[ServiceSpec] = []
    for name, url in _pairs(args.service, "--service"):
        if any(s.name == name for s in services):
            raise CannotRun(f"--service {name} is given twice")
        services.append(
            ServiceSpec(name, url, namespaces.pop(name, name), tuple(effects.pop(name, ())))
        )
    for option, left in (("--namespace", namespaces), ("--effect", effects)):
        if left:
            raise CannotRun(f"{option} names no --service: {', '.join(sorted(left))}")
    every = parse_duration(args.every, "--every") if args.every else None
    if every is not None and not args.state:
        raise CannotRun("--every needs --state DIR (where the running result is kept)")
    if args.examples < 0:
        raise CannotRun("--examples must be 0 or more")
    jars = tuple(j for j in (args.jars or "").split(",") if j)
    log, logs = _logs(args.log)
    return JobOptions(
        services=tuple(services),
        log=log,
        logs=logs,
        out=Path(args.out),
        grace_s=parse_duration(args.grace, "--grace"),
        master=args.master,
        state=Path(args.state) if args.state else None,
        every_s=every,
        json=args.json,
        jars=jars,
        examples=args.examples,
        shuffle_partitions=args.shuffle_partitions,
        progress=not args.quiet,
    )
