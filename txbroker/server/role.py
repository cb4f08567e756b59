"""What this broker serves now: every request (a master), or all but the writes (a slave).

A slave refuses the opcodes of :data:`WRITES` with ``NOT_MASTER`` naming its master; a broker of
an elected group serves :data:`MASTER_ONLY` only while it is master. The connection asks
:meth:`Role.check` once per request, before its handler runs; the handler table never changes.
"""

from __future__ import annotations

from typing import Final

from txbroker.errors import NotMaster
from txbroker.protocol.frames import Opcode

__all__ = ["GROUP_MEMBERSHIP", "MASTER_ONLY", "WRITES", "Role"]

# What a slave refuses: every request that writes the log, topics (a slave takes its registry
# from its master) or a group's committed offsets (a slave holds its master's, copied).
WRITES: Final = frozenset(
    {
        Opcode.SEND,
        Opcode.SEND_BATCH,
        Opcode.TX_PREPARE,
        Opcode.TX_END,
        Opcode.TX_RESOLVE,
        Opcode.ACK,
        Opcode.NACK,
        Opcode.DLQ_REDRIVE,
        Opcode.TOPIC_CREATE,
        Opcode.TOPIC_DELETE,
    }
)
# What else a broker of an elected group serves only as master: a consumer group lives on its
# group's master. A slave there may still hold a tail no later master has (it learns so only
# when it next fetches), and a position read on it could pass records the master writes there.
GROUP_MEMBERSHIP: Final = frozenset({Opcode.HEARTBEAT, Opcode.PULL, Opcode.LEAVE})
# An elected group's master only: writes, consumer groups and its slaves' fetches.
MASTER_ONLY: Final = WRITES | GROUP_MEMBERSHIP | {Opcode.REPL_FETCH}


class Role:
    """The opcodes refused now and why. Starts serving everything.

    ::

        role = Role()
        role.refuse(WRITES, "this broker is a slave of txb://m:9876: writes go to the master")
        role.check(Opcode.SEND)  # raises NotMaster with that text
        role.serve_all()
    """

    __slots__ = ("reason", "refused")

    def __init__(self) -> None:
        self.refused: frozenset[int] = frozenset()  # read by the connection on every request
        self.reason = ""

    def refuse(self, opcodes: frozenset[int], reason: str) -> None:
        """From now on answer ``opcodes`` with ``NOT_MASTER`` saying ``reason``."""
        self.refused = frozenset(opcodes)
        self.reason = reason

    def serve(self, opcodes: frozenset[int]) -> None:
        """Serve ``opcodes`` again; the others stay refused for the same reason."""
        self.refused = self.refused - opcodes

    def serve_all(self) -> None:
        self.refused = frozenset()
        self.reason = ""

    def check(self, opcode: int) -> None:
        if opcode in self.refused:
            raise NotMaster(self.reason)
