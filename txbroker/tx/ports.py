"""What the transaction coordinator needs from the broker around it, as an interface it owns.

The server drives transactions (its handlers call the coordinator), so the coordinator must not
reach back into the server's modules: a commit makes its message visible through this small
interface, which the server's producer implements (``txbroker.server.producer.Producer``).
"""

from __future__ import annotations

from typing import Protocol

from txbroker.protocol.messages import SendRequest
from txbroker.store import Message

__all__ = ["Publishing"]


class Publishing(Protocol):
    def to_message(self, req: SendRequest) -> Message:
        """The message a send of ``req`` would append: topic checked, queue chosen, properties
        set. Raises the broker's typed errors for a request it would refuse."""
        ...

    def schedule(self, msg: Message, deliver_at_ms: int) -> Message:
        """The copy of ``msg`` to append in its place so it is delivered at ``deliver_at_ms``;
        refuses an impossible time."""
        ...

    def scheduled(self, level: int) -> None:
        """A scheduled copy was appended at delay ``level``: wake its delivery."""
        ...

    def ensure_system_topic(self, name: str, queues: int) -> None:
        """Create the internal topic ``name`` unless it exists."""
        ...
