"""The web console at ``/console`` on the broker's HTTP port: topics, consumer groups and lag,
transactions with their timelines and the operator's actions, dead letters, the latest
reconciliation, the cluster as etcd has it. docs/console.md tells how to use it and how it is
secured.

It sits above ``txbroker.server`` (it reads the server's parts) and below the CLI, which hands
``console_routes`` to the server it starts.
"""

from txbroker.console.app import build_console, console_routes
from txbroker.console.context import ClusterLink, Deps, Settings

__all__ = [
    # mounting
    "console_routes",
    "build_console",
    # what it reads
    "ClusterLink",
    "Deps",
    "Settings",
]
