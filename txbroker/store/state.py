"""The store's lifecycle: ``StoreState`` and its one guarded transition function.

CREATED → RECOVERING → OPEN → FAILED | CLOSING → CLOSED. A FAILED store serves reads and
refuses appends with the failure that stopped it, until a restart.
"""

from __future__ import annotations

import enum

from txbroker.errors import StoreClosed, StoreFailed

__all__ = ["Lifecycle", "StoreState"]


class StoreState(enum.Enum):
    CREATED = "created"
    RECOVERING = "recovering"
    OPEN = "open"
    FAILED = "failed"  # a write or an fsync failed: reads work, appends refused
    CLOSING = "closing"
    CLOSED = "closed"


_ALLOWED: dict[StoreState, frozenset[StoreState]] = {
    StoreState.CREATED: frozenset({StoreState.RECOVERING, StoreState.CLOSED}),
    StoreState.RECOVERING: frozenset({StoreState.OPEN, StoreState.CLOSED}),
    StoreState.OPEN: frozenset({StoreState.FAILED, StoreState.CLOSING}),
    StoreState.FAILED: frozenset({StoreState.CLOSING}),
    StoreState.CLOSING: frozenset({StoreState.CLOSED}),
    StoreState.CLOSED: frozenset(),
}


class Lifecycle:
    """The state every part of a store checks before it acts, and why it failed."""

    __slots__ = ("failure", "state")

    def __init__(self) -> None:
        self.state = StoreState.CREATED
        self.failure: StoreFailed | None = None

    def advance(self, to: StoreState) -> None:
        if to not in _ALLOWED[self.state]:
            raise AssertionError(f"store cannot go from {self.state.value} to {to.value}")
        self.state = to

    def fail(self, failure: StoreFailed) -> None:
        """An open store failed: appends are refused with the first failure from now on."""
        if self.failure is None:
            self.failure = failure
        if self.state is StoreState.OPEN:
            self.advance(StoreState.FAILED)

    def check_open(self) -> None:
        if self.state is not StoreState.OPEN:
            if self.state is StoreState.FAILED and self.failure is not None:
                raise self.failure
            raise StoreClosed(f"the store is {self.state.value}")

    def check_readable(self) -> None:
        if self.state is not StoreState.OPEN and self.state is not StoreState.FAILED:
            raise StoreClosed(f"the store is {self.state.value}")
