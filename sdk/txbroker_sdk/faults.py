"""Crash points: kill this process at a named point of the SDK, for crash tests and the demo.

The SDK's guarantees are about processes dying at the worst moment, so tests and ``make demo``
make them die exactly there, with a real ``SIGKILL`` (no ``finally``, no atexit, no flush). Each
window calls :func:`point` with its name, which does nothing unless ``TXB_FAULTS`` arms it;
unarmed, a point costs one truth test and no call. Drops (:func:`dropped`) are armed the same way
but do not kill: the request is not sent, as if the network had lost it.
"""

from __future__ import annotations

import os
import random
import signal
from typing import Final

from txbroker.errors import InvalidArgument

__all__ = ["DROPS", "POINTS", "arm", "dropped", "point"]

POINTS: Final = frozenset(
    {"before_db_commit", "after_db_commit", "after_inbox_commit", "relay_after_send"}
)
DROPS: Final = frozenset({"drop_end_tx"})


class _Fault:
    __slots__ = ("at", "passes", "probability")

    def __init__(self, probability: float = 0.0, at: int = 0) -> None:
        self.probability = probability
        self.at = at  # die at this pass (1-based); 0: use the probability
        self.passes = 0


_armed: dict[str, _Fault] = {}
_loaded = False  # TXB_FAULTS is read at the first point() passed, not at import


def arm(spec: str) -> None:
    """Arm points from a ``TXB_FAULTS``-style spec (replacing what was armed)."""
    global _loaded
    _loaded = True
    armed: dict[str, _Fault] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, value = part.partition("=")
        if name not in POINTS | DROPS or not sep:
            raise InvalidArgument(
                f"bad fault {part!r}: expected name=probability or name=@n, "
                f"name one of {', '.join(sorted(POINTS | DROPS))}"
            )
        try:
            if value.startswith("@"):
                fault = _Fault(at=int(value[1:]))
                if fault.at < 1:
                    raise ValueError
            else:
                fault = _Fault(probability=float(value))
                if not 0.0 <= fault.probability <= 1.0:
                    raise ValueError
        except ValueError:
            raise InvalidArgument(
                f"bad fault {part!r}: the value is a probability in [0, 1] or @n with n >= 1"
            ) from None
        armed[name] = fault
    _armed.clear()
    _armed.update(armed)


def _hit(name: str) -> bool:
    if not _loaded:
        arm(os.environ.get("TXB_FAULTS", ""))
    fault = _armed.get(name)
    if fault is None:
        return False
    fault.passes += 1
    return fault.passes == fault.at if fault.at else random.random() < fault.probability


def point(name: str) -> None:
    """Die here, by SIGKILL, if this point is armed and its turn has come.

    Armed by the environment::

        TXB_FAULTS="after_db_commit=0.02"            # die at 2 % of the passes
        TXB_FAULTS="relay_after_send=@3"             # die at the 3rd pass
        TXB_FAULTS="before_db_commit=@1,after_ack=0" # several points, comma-separated

    Points: ``before_db_commit`` and ``after_db_commit`` (@transactional), ``after_inbox_commit``
    (@subscriber: committed, not acknowledged), ``relay_after_send`` (outbox relay: published, not
    marked).
    """
    assert name in POINTS, name
    if (_armed or not _loaded) and _hit(name):  # unarmed (the rule): no call at all
        os.kill(os.getpid(), signal.SIGKILL)


def dropped(name: str) -> bool:
    """True if this drop is armed and its turn has come: skip the request it names.

    The process lives on (its spans and logs leave normally). ``drop_end_tx`` (@transactional: the
    database committed, the END_TX is never posted; its back-check commits the message)::

        TXB_FAULTS="drop_end_tx=@1"                  # the first transaction's END_TX is lost
    """
    assert name in DROPS, name
    return (_armed or not _loaded) and _hit(name)
