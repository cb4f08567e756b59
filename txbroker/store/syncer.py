"""The syncer: a child process whose only job is ``fdatasync`` on commit-log segments.

A process, not a thread: a thread returning from ``fdatasync`` must take the GIL back from the
busy event loop (docs/benchmarks.md has the cost). The process runs on the other core and
talks to the loop through two pipes the loop watches with ``add_reader``. ``fdatasync`` flushes
the file's pages in the shared page cache whoever wrote them, so syncing by path covers the
broker's writes. Protocol: ``REQUEST`` and ``RESPONSE`` below. The child exits when its stdin
closes, so it never outlives the broker, even after kill -9.
"""

from __future__ import annotations

import os
import signal
import struct
import sys
from pathlib import Path
from typing import Final

__all__ = ["OP_FORGET", "OP_SYNC", "REQUEST", "RESPONSE", "main"]

REQUEST: Final = struct.Struct(
    "<"
    "B"  # op: OP_SYNC or OP_FORGET
    "I"  # seq: increments per request (mod 2**32); the response carries it back
    "Q"  # base: the segment's first physical offset (its file name)
)
RESPONSE: Final = struct.Struct(
    "<"
    "I"  # seq: the request answered
    "B"  # status: 0 ok, 1 error
    "H"  # errno: the failing call's error number when status is 1
)
assert REQUEST.size == 13 and RESPONSE.size == 7

OP_SYNC: Final = 1  # fdatasync the segment
OP_FORGET: Final = 2  # close our descriptor (the segment is being deleted)


def main(directory: str) -> int:
    # Only EOF on stdin ends the syncer: the broker decides when syncing is over.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    root = Path(directory)
    fds: dict[int, int] = {}
    pending = b""
    while True:
        try:
            data = os.read(0, 65536)
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue
        if not data:
            break
        pending += data
        n = len(pending) // REQUEST.size
        out = bytearray()
        synced: set[int] = set()
        for i in range(n):
            op, seq, base = REQUEST.unpack_from(pending, i * REQUEST.size)
            if op == OP_FORGET:
                fd = fds.pop(base, None)
                if fd is not None:
                    os.close(fd)
                out += RESPONSE.pack(seq, 0, 0)
                continue
            status, err = 0, 0
            try:
                fd = fds.get(base, -1)
                if fd < 0:
                    fd = fds[base] = os.open(root / f"{base:020d}", os.O_RDWR)
                if base not in synced:  # requests queued together share one fdatasync
                    os.fdatasync(fd)
                    synced.add(base)
            except OSError as e:
                status, err = 1, (e.errno or 0) & 0xFFFF
            out += RESPONSE.pack(seq, status, err)
        pending = pending[n * REQUEST.size :]
        if out:
            os.write(1, bytes(out))
    for fd in fds.values():
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
