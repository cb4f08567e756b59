"""``python -m txbroker.chaos orders|billing ...``: a service of the campaign (see
:mod:`txbroker.chaos.service`), started by the campaign as a child process."""

from txbroker.chaos.service import run_main

run_main()
