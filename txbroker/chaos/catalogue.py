"""The campaign's scenarios by name, in the order a campaign runs them, with what each does:
what `txbroker chaos --help` lists and ``--scenario`` accepts. A module of its own so the
command line reads it without importing the campaign (its services, SQLAlchemy, the broker);
``campaign.py`` wires each name to its code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["SCENARIO_HELP"]

SCENARIO_HELP: Final[Mapping[str, str]] = {
    "broker-kill": "kill -9 of the broker under sends, transactions, relay",
    "service-kill": "kill -9 of services mid-@transactional, mid-relay, mid-subscriber",
    "broker-stop": "SIGSTOP of the broker past the check timeout, SIGCONT",
    "network": "a TCP proxy between services and broker: latency, resets, truncation",
    "postgres-restart": "the services' private PostgreSQL restarted under a subscriber and a relay",
    "disk-full": "the broker's disk (a small tmpfs) filled under load, then emptied",
    "master-failover": "kill -9 of a group's master (2 groups of 3, sync replication) under load",
    "master-failover-async": "the same with async replication: the loss window measured",
}
