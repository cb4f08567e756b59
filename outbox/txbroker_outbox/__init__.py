"""The transactional outbox: write a message in the business transaction; a relay publishes it.

async with sessions() as session, session.begin():
    await session.execute(orders.insert().values(id="o-42"))
    await add(session, "orders", {"id": "o-42"}, key="o-42")  # commits with the order

relay = Relay(client, engine, namespace="orders-db")  # or: txbroker outbox relay --url URL
await relay.run(stop)
"""

from txbroker_outbox.relay import Relay
from txbroker_outbox.runner import relay_main
from txbroker_outbox.writer import CHANNEL, add

__all__ = [
    # writing, in the caller's transaction
    "add",
    "CHANNEL",
    # publishing
    "Relay",
    "relay_main",
]
