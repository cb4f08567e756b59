"""``python -m txbroker.cli``: the same as the ``txbroker`` command."""

import sys

from txbroker.cli import main

sys.exit(main())
