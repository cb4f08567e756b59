"""The fault campaign (`txbroker chaos`): a broker, two services and their databases under
load, faults injected round after round (kill -9, SIGSTOP, a faulty network, a database
restart, a full disk), then the checks: no acknowledged message lost, no effect applied twice,
every transaction as its local decision says, and the Spark reconciliation when present.

    rows = await run_campaign(CampaignOptions(scenarios=("broker-kill",), sizes=Sizes(rounds=3)))
    print_table(rows)
"""

from txbroker.chaos.campaign import SCENARIOS, CampaignOptions, Scenario, run_campaign
from txbroker.chaos.figures import Figures, print_table, table
from txbroker.chaos.scenarios import Sizes

__all__ = [
    # running it
    "CampaignOptions",
    "SCENARIOS",
    "Scenario",
    "Sizes",
    "run_campaign",
    # its figures
    "Figures",
    "print_table",
    "table",
]
