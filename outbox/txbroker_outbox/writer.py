"""Writing to the outbox: a message row inserted in the caller's own transaction.

    async with sessions() as session, session.begin():
        await add(session, "orders", {"id": "o-42"}, key="o-42")  # commits with the order

The row commits or rolls back with the business rows; a relay (:mod:`txbroker_outbox.relay`)
publishes it afterwards. With tracing on, the row's headers keep the current span's
``traceparent`` (a caller's own wins), so the relay's ``send`` span joins the trace the row was
written in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from txbroker.errors import InvalidArgument
from txbroker.protocol.names import validate_topic
from txbroker.runtime.tracing import traceparent, tracing_on
from txbroker_sdk.tables import OUTBOX
from txbroker_sdk.transactional import encode_body

__all__ = ["CHANNEL", "TRACEPARENT", "add"]

CHANNEL: Final = "txb_outbox"  # PostgreSQL NOTIFY channel: a committed add wakes the relays
# The row's header that keeps the W3C trace context it was written in (tracing on only); the
# relay replaces it with its send span's, so consumers continue the trace from there.
TRACEPARENT: Final = "traceparent"


def _max_len(column: Any) -> int:
    length: int = column.type.length
    return length


def _check_identifier(name: str, value: str | None, column: Any) -> None:
    # The broker refuses these too, but only when the relay sends: a row it refuses would stay
    # in the outbox forever (and hold back its key), so refuse it here, in the caller's code.
    if value is None:
        return
    limit = _max_len(column)
    if not value or len(value.encode()) > limit or " " in value:
        raise InvalidArgument(f"outbox {name} must be 1-{limit} bytes with no spaces: {value!r}")


async def add(
    session: AsyncSession | AsyncConnection,
    topic: str,
    body: object,
    *,
    key: str | None = None,
    tags: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> int:
    """Insert an outbox row in the caller's transaction; return its id. ``body``: bytes as
    they are, str as UTF-8, anything else as JSON."""
    validate_topic(topic, allow_system=False)
    if len(topic) > _max_len(OUTBOX.c.topic):  # pragma: no cover - validate_topic's bound
        raise InvalidArgument(f"outbox topic longer than {_max_len(OUTBOX.c.topic)}: {topic!r}")
    _check_identifier("key", key, OUTBOX.c.key)
    _check_identifier("tags", tags, OUTBOX.c.tags)
    values: dict[str, Any] = {"topic": topic, "key": key, "tags": tags, "body": encode_body(body)}
    if headers:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise InvalidArgument("outbox headers must map str to str")
        values["headers"] = dict(headers)
    if tracing_on() and (tp := traceparent()) is not None:
        # The trace this row was written in: the relay's send span continues it.
        values["headers"] = {TRACEPARENT: tp, **(values.get("headers") or {})}
    row_id: int = (
        await session.execute(OUTBOX.insert().values(values).returning(OUTBOX.c.id))
    ).scalar_one()
    bind = session.get_bind() if isinstance(session, AsyncSession) else session
    if bind.dialect.name == "postgresql":
        # Delivered when (and only if) this transaction commits: the relays wake then.
        await session.execute(select(func.pg_notify(CHANNEL, "")))
    return row_id
