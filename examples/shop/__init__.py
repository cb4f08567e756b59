"""A pair of FastAPI services, orders -> billing: the README's service example, run by a test."""
