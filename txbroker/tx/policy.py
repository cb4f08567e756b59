"""What a PREPARE must name before anything is written: :class:`PreparePolicy`.

A producer group with a check-back secret (back-checks are signed with it, so a group without
one could never be checked), an http(s) check URL or ``pull`` (its checks wait for the group's
pollers, ``txbroker.tx.pull``), a timeout within the configured bounds, and
a transaction id of the allowed characters (chosen here when the client sent none). Groups and
URLs that passed once are remembered, so a steady stream of PREPAREs re-validates nothing.
Separate from the coordinator because it is policy, not transaction state; the back-checker asks
:meth:`PreparePolicy.secret_for` for the signing key.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit

from txbroker.errors import InvalidArgument
from txbroker.protocol.ids import new_id
from txbroker.protocol.messages import TxPrepareRequest
from txbroker.protocol.names import validate_topic
from txbroker.tx.pull import PULL_CHECK_URL

__all__ = ["PreparePolicy"]

_TX_ID: Final = re.compile(r"[A-Za-z0-9_\-]{1,64}")
# Producer groups and check URLs validated once are remembered (up to this many each), so a
# PREPARE re-validates only names it has not seen.
SEEN_MAX: Final = 4096


class PreparePolicy:
    """Decides whether a PREPARE is admitted: :meth:`check` raises ``InvalidArgument`` if not."""

    def __init__(
        self,
        secrets: dict[str, str],
        default_secret: str | None,
        timeout_ms: int,
        max_timeout_ms: int,
    ) -> None:
        self._secrets = secrets  # producer group -> secret
        self._default_secret = default_secret
        self._timeout_ms = timeout_ms
        self._max_timeout_ms = max_timeout_ms
        self._groups_seen: set[str] = set()
        self._urls_seen: set[str] = {PULL_CHECK_URL}  # valid as it is: not a URL to parse

    def secret_for(self, group: str) -> str | None:
        return self._secrets.get(group, self._default_secret)

    def check(self, req: TxPrepareRequest) -> tuple[str, int]:
        """Validate what a PREPARE names; its transaction id (chosen here if the client did
        not) and timeout."""
        group = req.producer_group
        if group not in self._groups_seen:
            validate_topic(group, allow_system=False)
            if self.secret_for(group) is None:
                raise InvalidArgument(
                    f"no check-back secret is configured for producer group {group!r} "
                    "(serve --tx-secret GROUP=SECRET)"
                )
            if len(self._groups_seen) < SEEN_MAX:
                self._groups_seen.add(group)
        if req.check_url not in self._urls_seen:
            url = urlsplit(req.check_url)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise InvalidArgument(
                    f"check_url must be an http(s) URL or {PULL_CHECK_URL!r}, not {req.check_url!r}"
                )
            if len(self._urls_seen) < SEEN_MAX:
                self._urls_seen.add(req.check_url)
        timeout = self._timeout_ms if req.timeout_ms is None else req.timeout_ms
        if not 0 < timeout <= self._max_timeout_ms:
            raise InvalidArgument(f"timeout_ms must be 1..{self._max_timeout_ms}")
        tx_id = req.tx_id or new_id()
        if _TX_ID.fullmatch(tx_id) is None:
            raise InvalidArgument("tx_id must be 1-64 characters of A-Z a-z 0-9 _ -")
        return tx_id, timeout
