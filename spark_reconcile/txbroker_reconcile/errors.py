"""The one error the job raises on purpose: it could not run (exit code 2), with a cause that
names the input at fault."""

from __future__ import annotations

from txbroker.errors import InvalidArgument

__all__ = ["CannotRun"]


class CannotRun(InvalidArgument):
    """An input the job needs is unreachable, missing or malformed; the message names it and
    says what to do."""

    exit_code = 2
