"""The process's open-file limit (RLIMIT_NOFILE): raised to the hard limit at start, and the
count of files open now, from which the broker derives how many connections it can hold.

Every connection is a file descriptor, as is every mapped store file. Many systems start a
process with a soft limit of 1,024 (systemd, most shells) while the hard limit allows far more;
a broker left at 1,024 runs out of descriptors at about a thousand sockets, and then the event
loop accepts and drops every new connection, real clients included.
"""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import dataclass
from typing import Final

__all__ = ["NOFILE_FALLBACK_MAX", "FileLimit", "open_files", "raise_nofile_limit"]

log = logging.getLogger(__name__)

# When the hard limit is "unlimited", Linux still refuses a soft limit above fs.nr_open, whose
# default is 1,048,576: the highest value worth asking for.
NOFILE_FALLBACK_MAX: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class FileLimit:
    before: int  # the soft limit the process started with
    soft: int  # the soft limit now
    hard: int  # the hard limit (resource.RLIM_INFINITY for none)


def raise_nofile_limit() -> FileLimit:
    """Raise the soft RLIMIT_NOFILE to the hard one, log what happened, and return both.

    A refusal (a sandbox, an exotic platform) is logged as a warning and leaves the limit as it
    was: the broker then holds fewer connections, it does not fail to start."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NOFILE_FALLBACK_MAX if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as e:
            log.warning("open files: cannot raise the soft limit %d to %d: %s", soft, target, e)
            return FileLimit(soft, soft, hard)
        log.info("open files: soft limit raised from %d to %d (the hard limit)", soft, target)
        return FileLimit(soft, target, hard)
    log.info("open files: soft limit %d (hard limit %s)", soft, _show(hard))
    return FileLimit(soft, soft, hard)


def open_files() -> int:
    """Descriptors this process has open now (0 where the platform does not list them)."""
    for d in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(d)) - 1  # the listing's own descriptor
        except OSError:
            continue
    return 0


def _show(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)
