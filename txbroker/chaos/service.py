"""The services the fault campaign kills: ``python -m txbroker.chaos orders|billing``.

``orders`` places orders with ``@transactional``, relays its outbox and answers back-checks;
``billing`` applies every message once through the inbox, as rows whose doubles the campaign
counts (:func:`orders` and :func:`billing` say what each prints and writes). Both print
``READY`` once connected, stop on SIGTERM (finishing what is in flight), and die where
``TXB_FAULTS`` arms a crash point (:mod:`txbroker_sdk.faults`). A process lives at most
``--lifetime-s``: a campaign that lost track of it must not leave it running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from typing import Final

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from starlette.applications import Starlette
from starlette.routing import Route

import txbroker_outbox as outbox
from txbroker.errors import TxbError
from txbroker.runtime.httpserve import HttpServer
from txbroker.runtime.signals import stop_on_signals
from txbroker_checkback import CheckbackEndpoint
from txbroker_sdk import ConsumedMessage
from txbroker_sdk.barrier import BarrierResolver
from txbroker_sdk.cluster import client_for
from txbroker_sdk.database import create_engine
from txbroker_sdk.subscriber import Subscribers
from txbroker_sdk.transactional import TxPublisher

__all__ = [
    "AUDIT",
    "EFFECTS",
    "GROUP",
    "NAMESPACE",
    "ORDERS",
    "ORDERS_TABLE",
    "PLAIN",
    "SUBSCRIPTIONS",
    "create_tables",
    "run_main",
]

ORDERS, AUDIT, PLAIN = "orders", "audit", "plain"
GROUP: Final = "chaos-orders"  # the producer group, whose secret the broker is given
NAMESPACE: Final = "orders"  # the outbox namespace of the orders database
SUBSCRIPTIONS: Final = ((ORDERS, "billing"), (AUDIT, "auditor"), (PLAIN, "plainer"))
CHECK_PATH: Final = "/txb/check"
metadata = sa.MetaData()
ORDERS_TABLE: Final = sa.Table(
    "chaos_orders", metadata, sa.Column("id", sa.String(64), primary_key=True)
)
EFFECTS: Final = sa.Table(
    "chaos_effects",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("ref", sa.String(128), nullable=False, index=True),  # topic:body, no unique key
)
# A failed order (the broker away) is tried again this much later: a fast loop of failures
# would only fill the log while the broker restarts.
RETRY_PAUSE_S: Final = 0.2
log = logging.getLogger("txbroker.chaos.service")


async def create_tables(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)


async def orders(args: argparse.Namespace, stop: asyncio.Event) -> None:
    """Places orders with ``@transactional`` on ``orders`` (the order row, the barrier and an
    ``audit`` outbox row in one database transaction), relays its outbox, and answers the broker's
    back-checks on ``--host``:``--port`` (a fixed port: the broker knows the URL of every half
    message, so a restarted service must answer at the same one; the host is the address the
    brokers reach this one by). Prints ``placed ID`` once a ``@transactional``
    call returned, flushed at once, so the campaign knows what the service saw committed before it
    died. Stops placing on SIGUSR1 (and prints ``DONE``) but goes on relaying and answering
    back-checks, so the campaign can let everything settle.
    """
    engine = create_engine(args.db)
    check_url = f"http://{args.host}:{args.port}{CHECK_PATH}"
    endpoint = CheckbackEndpoint(BarrierResolver(engine), {GROUP: args.secret})
    http = HttpServer(
        Starlette(routes=[Route(CHECK_PATH, endpoint, methods=["POST"])]),
        host=args.host,
        port=args.port,
    )
    try:
        await create_tables(engine)
        await http.start()
        # Connected on first use: a service restarted while the broker is away still starts.
        async with client_for(args.broker, timeout_s=args.timeout_s) as client:
            sessions = async_sessionmaker(engine)
            publisher = TxPublisher(client, sessions, producer_group=GROUP, check_url=check_url)
            relay = outbox.Relay(client, engine, namespace=NAMESPACE, poll_interval_s=0.2)

            @publisher.transactional(ORDERS, key=lambda oid: oid)
            async def place(session: AsyncSession, oid: str) -> str:
                await session.execute(ORDERS_TABLE.insert().values(id=oid))
                await outbox.add(session, AUDIT, oid.encode(), key=oid)
                return oid

            counter = iter(range(1, args.orders + 1))
            enough = asyncio.Event()  # SIGUSR1: stop placing, go on answering and relaying
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, enough.set)

            async def placer() -> None:
                for n in counter:
                    if stop.is_set() or enough.is_set():
                        return
                    oid = f"{args.prefix}{n}"
                    try:
                        await place(oid)
                    except Exception as e:  # whatever broke (broker, network, database): go on
                        log.warning("order %s failed: %s: %s", oid, type(e).__name__, e)
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), RETRY_PAUSE_S)
                        continue
                    print(f"placed {oid}", flush=True)

            relaying = asyncio.create_task(relay.run(stop))
            print("READY", flush=True)
            await asyncio.gather(*(placer() for _ in range(args.concurrency)))
            print("DONE", flush=True)
            await stop.wait()  # the relay and the check-back endpoint serve on until SIGTERM
            await relaying
            with contextlib.suppress(TxbError, TimeoutError):
                await publisher.flush(5)
    finally:
        await http.stop()
        await engine.dispose()


async def billing(args: argparse.Namespace, stop: asyncio.Event) -> None:
    """Applies every message of ``orders``, ``audit`` and ``plain`` once, through the inbox
    (``@subscriber``), each as one row of ``chaos_effects`` whose ``ref`` has no unique key: a
    message applied twice is two rows, which is what the campaign counts.
    """
    engine = create_engine(args.db)
    try:
        await create_tables(engine)
        async with client_for(args.broker, timeout_s=args.timeout_s) as client:
            subs = Subscribers(client, async_sessionmaker(engine))
            for topic, group in SUBSCRIPTIONS:

                async def apply(
                    session: AsyncSession, msg: ConsumedMessage, topic: str = topic
                ) -> None:
                    # A plain body may be padded after a "|" (the disk-full scenario's).
                    ref = f"{topic}:{msg.body.split(b'|', 1)[0].decode()}"
                    await session.execute(EFFECTS.insert().values(ref=ref))

                subs.subscriber(topic, group=group)(apply)
            print("READY", flush=True)
            await subs.run(stop)
    finally:
        await engine.dispose()


async def main(args: argparse.Namespace) -> None:
    stop = stop_on_signals()
    asyncio.get_running_loop().call_later(args.lifetime_s, stop.set)
    await (orders if args.role == "orders" else billing)(args, stop)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m txbroker.chaos")
    p.add_argument("role", choices=["orders", "billing"])
    p.add_argument("--db", required=True, help="the service's database URL")
    p.add_argument("--broker", required=True, help="txb://host:port, or txbns://host:port,...")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="orders: the check-back endpoint's address, as the brokers reach it",
    )
    p.add_argument("--port", type=int, default=0, help="orders: the check-back endpoint's port")
    p.add_argument("--secret", default="", help="orders: the producer group's check secret")
    p.add_argument("--orders", type=int, default=1_000_000, help="orders: how many to place")
    p.add_argument("--prefix", default="o", help="orders: the order ids' prefix")
    p.add_argument("--concurrency", type=int, default=2, help="orders: placers at once")
    p.add_argument("--timeout-s", type=float, default=5.0, help="the client's request timeout")
    p.add_argument("--lifetime-s", type=float, default=600.0, help="stop after this long")
    return p.parse_args(argv)


def run_main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main(parse()))
