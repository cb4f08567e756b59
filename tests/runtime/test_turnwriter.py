"""TurnWriter: what one turn of the event loop queues leaves in one write, in order."""

from __future__ import annotations

import asyncio

from txbroker.runtime.turnwriter import TurnWriter


async def test_one_write_per_turn_in_order() -> None:
    writes: list[bytes] = []
    out = TurnWriter(asyncio.get_running_loop(), writes.append)
    out.add(b"a")
    out.add(b"b")
    assert writes == []  # not before the turn ends
    await asyncio.sleep(0)  # let the turn end: the scheduled flush runs
    assert writes == [b"ab"]
    out.add(b"c")
    await asyncio.sleep(0)
    assert writes == [b"ab", b"c"]


async def test_flush_writes_now_and_clear_drops() -> None:
    writes: list[bytes] = []
    out = TurnWriter(asyncio.get_running_loop(), writes.append)
    out.add(b"a")
    out.flush()  # before a close
    assert writes == [b"a"]
    out.add(b"lost")
    out.clear()  # the connection dropped: its frames must not reach a successor
    await asyncio.sleep(0)
    assert writes == [b"a"]  # the scheduled flushes found nothing
