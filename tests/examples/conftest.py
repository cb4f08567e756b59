"""The examples' tests use the SDK's database fixtures."""

from tests.sdk.conftest import pg_url  # noqa: F401 - a fixture, used by name
