"""The fault campaign (`txbroker chaos`): a broker, two services and their databases under
load, faults injected round after round (kill -9, SIGSTOP, a faulty network, a database
restart, a full disk), then the checks: no acknowledged message lost, no effect applied twice,
every transaction as its local decision says, and the Spark reconciliation when present.

    rows = await run_campaign(CampaignOptions(scenarios=("broker-kill",), sizes=Sizes(rounds=3)))
    print_table(rows)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from txbroker.chaos.catalogue import SCENARIO_HELP

if TYPE_CHECKING:
    from txbroker.chaos.campaign import SCENARIOS, CampaignOptions, Scenario, run_campaign
    from txbroker.chaos.figures import Figures, print_table, table
    from txbroker.chaos.scenarios import Sizes

# The campaign brings the services, SQLAlchemy and the broker's modules: imported when first
# asked for, so the command line's parser and the campaign's child processes start without them.
_LAZY: dict[str, str] = {
    "CampaignOptions": "txbroker.chaos.campaign",
    "SCENARIOS": "txbroker.chaos.campaign",
    "Scenario": "txbroker.chaos.campaign",
    "run_campaign": "txbroker.chaos.campaign",
    "Sizes": "txbroker.chaos.scenarios",
    "Figures": "txbroker.chaos.figures",
    "print_table": "txbroker.chaos.figures",
    "table": "txbroker.chaos.figures",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'txbroker.chaos' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


__all__ = [
    # running it
    "CampaignOptions",
    "SCENARIOS",
    "SCENARIO_HELP",
    "Scenario",
    "Sizes",
    "run_campaign",
    # its figures
    "Figures",
    "print_table",
    "table",
]
