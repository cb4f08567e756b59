"""Ending background tasks for certain."""

from __future__ import annotations

import asyncio
from typing import Any, Final

# How long one cancellation is given before it is delivered again (see cancel_and_wait).
_RECANCEL_S: Final = 0.1


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling again while it has not.

    One ``cancel()`` is not always enough on Python 3.11: ``asyncio.wait_for`` (which aetcd
    uses, e.g. while a watch is being created) drops a cancellation that arrives in the same
    loop iteration as its inner result (CPython gh-86296, fixed in 3.12), and the task carries
    on, in a watch that may never yield. Seen here as a resign() that hung.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=_RECANCEL_S)
    if not task.cancelled():
        task.exception()  # retrieved: an error of a task being ended is not news
