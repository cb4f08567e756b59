"""The reconciliation suite's Spark session fixture (one local session; by hand the tests that
use it skip without PySpark, Java or the JDBC jars, under CI=true they fail). ``spark`` needs
``spark_jars``: both are imported, or pytest cannot resolve it here."""

from tests.reconcile.conftest import spark, spark_jars

__all__ = ["spark", "spark_jars"]
