"""Back-checks by pull, for services that cannot be called back (behind NAT, batch jobs,
serverless):

    POST /v1/producer-groups/{group}/checks     long-poll the checks due to the group: 200
    POST /v1/transactions/{tx_id}/unknown        answer a pulled check UNKNOWN: 200

A transaction prepared with ``"check_url": "pull"`` is back-checked on the same schedule as one
with an endpoint; its check waits for a poller of its producer group instead of being sent
(``txbroker.tx.pull``). The poller answers with the producer's own ``commit`` or ``rollback``
(``messaging.py``: the END_TX path, fenced as ever) or with ``unknown`` here, which counts as a
check answered UNKNOWN. Polling needs a token with ``produce``, and hands out only the checks of
topics it may produce to (those it could answer); answering needs ``produce`` on the
transaction's topic, as committing does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from txbroker.errors import NotFound, TransactionConflict
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import TxEndRequest
from txbroker.protocol.names import validate_topic
from txbroker.server.access import Access
from txbroker.server.http.bodies import decode, json_response, read_json
from txbroker.server.http.guard import guarded, principal, redirecting
from txbroker.server.http.problems import Conflict
from txbroker.server.http.types import CheckAnswered, PullChecks, PulledChecks
from txbroker.server.tokens import Role, TokenTable
from txbroker.tx.checker import BackChecker
from txbroker.tx.coordinator import TxCoordinator
from txbroker.tx.state import Tx

__all__ = ["PullChecking"]


class PullChecking:
    """The endpoints above, over the broker's back-checker and coordinator (None when the
    broker has no transactions: every request is then 404)."""

    def __init__(
        self,
        checker: BackChecker | None,
        tx: TxCoordinator | None,
        access: Access,
        *,
        master_http: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._checker = checker
        self._tx = tx
        self._access = access
        self._master_http = master_http

    def routes(self, tokens: TokenTable) -> list[BaseRoute]:
        def route(
            path: str, fn: Callable[[Request], Awaitable[Response]], role: Role | None
        ) -> Route:
            endpoint = guarded(redirecting(fn, self._master_http), tokens, role=role)
            return Route(path, endpoint, methods=["POST"])

        return [
            route("/v1/producer-groups/{group}/checks", self.poll, Role.PRODUCE),
            route("/v1/transactions/{tx_id}/unknown", self.unknown, None),
        ]

    def _checking(self) -> BackChecker:
        if self._checker is None:
            raise NotFound("transactions are not enabled on this broker")
        return self._checker

    async def poll(self, request: Request) -> Response:
        checker = self._checking()
        group = request.path_params["group"]
        validate_topic(group, allow_system=False)  # a producer group has a topic's name
        p = decode(await read_json(request), PullChecks)
        who = principal(request)

        def may(tx: Tx) -> bool:
            return who.may(Role.PRODUCE, tx.topic)

        checks = await checker.pull(group, p.max, p.wait_ms / 1000, may)
        return json_response(PulledChecks(checks, checker.settings.deadline_ms), 200)

    async def unknown(self, request: Request) -> Response:
        checker = self._checking()
        tx_id = request.path_params["tx_id"]
        self._access.check(principal(request), Opcode.TX_END, TxEndRequest(tx_id, "unknown"))
        try:
            tx = await checker.answer_unknown(tx_id)
        except TransactionConflict as e:
            state = self._tx.find(tx_id) if self._tx is not None else None
            raise Conflict(str(e), code=e.code, state=state.state.value if state else None) from e
        return json_response(
            CheckAnswered(tx.tx_id, tx.state.value, tx.checks, tx.next_check_ms), 200
        )
