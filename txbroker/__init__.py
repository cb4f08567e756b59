"""txbroker: transactional messaging middleware for Python microservices."""

from txbroker.errors import TxbError

__all__ = ["TxbError", "__version__"]

__version__ = "0.1.0"
