"""A stored message as a page shows it: its key, tags and headers, the transaction it belongs
to (so the page can link its timeline), and a bounded preview of its body (text when it is
UTF-8, hex otherwise). Everything here is user data: templates escape it; this module only
bounds its size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from txbroker.server.producer import HEADER_PREFIX
from txbroker.store import StoredMessage
from txbroker.tx.state import PROP_TX

__all__ = ["BODY_PREVIEW_CHARS", "MessageView", "clip"]

# Enough of a body to recognise it (an order as JSON fits), short enough that a page listing
# twenty messages stays readable; a header or key is clipped shorter.
BODY_PREVIEW_CHARS: Final = 300
FIELD_PREVIEW_CHARS: Final = 120
HEX_PREVIEW_BYTES: Final = 48
HEADERS_SHOWN_MAX: Final = 20


def clip(text: str, limit: int = FIELD_PREVIEW_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


@dataclass(frozen=True, slots=True)
class MessageView:
    message_id: str
    topic: str
    queue: int
    offset: int
    keys: list[str]
    tags: str | None
    headers: list[tuple[str, str]]
    stored_ms: int
    size: int
    body: str
    binary: bool
    clipped: bool
    tx_id: str | None  # the transaction that published it; None for a plain send

    @classmethod
    def of(cls, m: StoredMessage) -> MessageView:
        headers = [
            (clip(k[len(HEADER_PREFIX) :]), clip(v))
            for k, v in sorted(m.properties.items())
            if k.startswith(HEADER_PREFIX)
        ][:HEADERS_SHOWN_MAX]
        try:
            text = m.body.decode("utf-8")
            binary = False
            clipped = len(text) > BODY_PREVIEW_CHARS
            body = text[:BODY_PREVIEW_CHARS]
        except UnicodeDecodeError:
            binary = True
            clipped = len(m.body) > HEX_PREVIEW_BYTES
            body = m.body[:HEX_PREVIEW_BYTES].hex(" ")
        return cls(
            m.message_id or "",
            m.topic,
            m.queue_id,
            m.queue_offset,
            [clip(k) for k in m.keys],
            clip(m.tags) if m.tags else None,
            headers,
            m.store_timestamp_ms,
            len(m.body),
            body,
            binary,
            clipped,
            m.properties.get(PROP_TX) or None,
        )
