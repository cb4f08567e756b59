"""`txbroker bench peers`: txbroker against RabbitMQ and NATS JetStream, same workloads, one run.

Modules: ``system.py`` (what each system provides), ``workloads.py`` (single, batch, e2e over
any system), ``txb.py``, ``rabbitmq.py``, ``jetstream.py`` (the systems and their durability),
``options.py`` and ``run.py`` (the interleaved rounds, medians and ratios).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from txbroker.bench.peers.options import FLUSH_MODES, PEERS, WORKLOADS, PeersOptions

if TYPE_CHECKING:
    from txbroker.bench.peers.run import RATIO_METRICS, bench_peers

# The run brings the systems' clients and the SDK: imported when first asked for, so the
# command line's parser reads the choices above without them.
_LAZY: dict[str, str] = {
    "RATIO_METRICS": "txbroker.bench.peers.run",
    "bench_peers": "txbroker.bench.peers.run",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'txbroker.bench.peers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


__all__ = [
    # running it
    "bench_peers",
    "PeersOptions",
    # the choices and what the ratios compare
    "FLUSH_MODES",
    "PEERS",
    "RATIO_METRICS",
    "WORKLOADS",
]
