"""`txbroker outbox relay`: run an outbox relay as a process until SIGINT/SIGTERM.

Imported only when that command runs: it needs the ``sdk`` extra (SQLAlchemy and a driver).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Final

from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from txbroker.errors import TxbError
from txbroker.runtime.signals import stop_on_signals
from txbroker.runtime.tracing import setup_tracing
from txbroker_outbox.relay import DEFAULT_SHUTDOWN_TIMEOUT_S, Relay
from txbroker_sdk.cluster import client_for
from txbroker_sdk.database import async_url, create_engine
from txbroker_sdk.preflight import require_tables
from txbroker_sdk.tables import OUTBOX

__all__ = ["PROGRESS_INTERVAL_S", "relay_main"]

PROGRESS_INTERVAL_S: Final = 5.0


async def relay_main(
    db_url: str,
    server: str,
    *,
    namespace: str,
    batch_size: int,
    ordered: bool,
    poll_interval_s: float,
    auth_token: str | None,
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> None:
    setup_tracing("txbroker-outbox-relay")  # only when OTEL_* asks for traces
    url = async_url(db_url)
    shown = make_url(url).render_as_string(hide_password=True)
    engine = create_engine(url)  # SQLite: WAL and a busy timeout, beside the service
    # Connects on first use (the arguments are checked first); TLS with a txbs:// server,
    # routed through NameServers with txbns://.
    client = client_for(
        server, auth_token=auth_token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
    )
    try:
        relay = Relay(
            client,
            engine,
            namespace=namespace,
            batch_size=batch_size,
            ordered=ordered,
            poll_interval_s=poll_interval_s,
            shutdown_timeout_s=shutdown_timeout_s,
        )
        # Check both ends before running (and saying "started"): a wrong URL, a database without the
        # tables or a wrong token fails the start, visibly, instead of every round.
        try:
            await require_tables(engine, OUTBOX)  # TablesMissing: says to run `db upgrade`
        except (SQLAlchemyError, OSError) as e:
            reason = getattr(e, "orig", None) or e  # the driver's message, without the SQL
            raise TxbError(f"cannot reach the database {shown} ({reason!r}); is it up?") from e
        await client.ping()  # a broker still starting gets the client's connect deadline
        stop = stop_on_signals()
        # run() logs "outbox relay started ..." (the command's logging shows INFO).
        progress = asyncio.create_task(_progress(relay))
        try:
            await relay.run(stop)
        finally:
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress
        print(f"outbox relay stopped {_counters(relay)}", file=sys.stderr, flush=True)
    finally:
        await client.close()
        await engine.dispose()


def _counters(relay: Relay) -> str:
    return (
        f"published={relay.published} duplicates={relay.duplicates} failed={relay.failed} "
        f"errors={relay.errors} rounds={relay.rounds}"
    )


async def _progress(relay: Relay) -> None:
    last = -1
    while True:
        await asyncio.sleep(PROGRESS_INTERVAL_S)
        moved = relay.published + relay.failed + relay.errors
        if moved != last:  # quiet while idle
            last = moved
            print(f"outbox relay {_counters(relay)}", file=sys.stderr, flush=True)
