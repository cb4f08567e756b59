"""`txbroker bench peers`: txbroker against RabbitMQ and NATS JetStream, same workloads, one run.

Modules: ``system.py`` (what each system provides), ``workloads.py`` (single, batch, e2e over
any system), ``txb.py``, ``rabbitmq.py``, ``jetstream.py`` (the systems and their durability),
``options.py`` and ``run.py`` (the interleaved rounds, medians and ratios).
"""

from txbroker.bench.peers.options import FLUSH_MODES, PEERS, WORKLOADS, PeersOptions
from txbroker.bench.peers.run import RATIO_METRICS, bench_peers

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
