"""Three small services that use the txbroker SDK, and the demo that runs them under faults.

* ``examples.orders``: an HTTP API; ``POST /orders`` writes the order and publishes ``orders``
  with ``@transactional``, and adds an ``inventory`` message to the outbox in the same
  transaction; it mounts the check-back endpoint.
* ``examples.billing``: ``@subscriber("orders", group="billing")`` writes a payment per order.
* ``examples.inventory``: ``@subscriber("inventory", group="inventory")``, fed by the outbox
  relay, writes a stock reservation per order.
* ``examples.demo``: ``make demo`` (the README's first command).
"""
