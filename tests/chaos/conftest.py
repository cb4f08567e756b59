"""The reconciliation suite's Spark session fixture (one local session; by hand the tests that
use it skip without PySpark, Java or the JDBC jars, under CI=true they fail)."""

from tests.reconcile.conftest import spark

__all__ = ["spark"]
