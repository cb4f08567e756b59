"""The reconciliation as a Spark application, for spark-submit:

    spark-submit --master spark://host:7077 \\
        --jars /usr/share/java/postgresql.jar \\
        --py-files txbroker_reconcile.zip \\
        spark_reconcile/job.py --service orders=postgresql://… --log /export/log --out /reports

It takes the arguments of ``txbroker reconcile`` (docs/reconciliation.md); under spark-submit
the master and jars are spark-submit's.
"""

import sys

from txbroker_reconcile.run import main

if __name__ == "__main__":
    sys.exit(main(prog="spark-submit spark_reconcile/job.py"))
