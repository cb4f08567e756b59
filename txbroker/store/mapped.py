"""A fixed-size, preallocated, memory-mapped file: the unit of every store file.

Commit-log segments, consume-queue files and key-index files are all one of these. Space is
reserved up front with ``posix_fallocate`` so a full disk fails loudly at creation instead of
with SIGBUS on a later write into a sparse mapping. Queue and index entries are written through
the mapping; commit-log records are written with ``pwrite`` (see commitlog.py) and read through
the mapping. Either way ``fdatasync`` on the file covers them: the page cache is shared.

Files are reference counted so that retention never unmaps a file another thread is reading.
"""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

from txbroker.errors import StoreFailed

__all__ = ["TMP_SUFFIX", "MappedFile", "fsync_dir", "remove_temporaries"]

TMP_SUFFIX = ".tmp"


def remove_temporaries(directory: Path) -> None:
    """Delete files a crash left half-created (see :meth:`MappedFile.create`)."""
    if directory.exists():
        for p in directory.glob("*" + TMP_SUFFIX):
            p.unlink(missing_ok=True)


def fsync_dir(path: Path) -> None:
    """Make a directory entry change (create, rename, unlink) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MappedFile:
    """One preallocated file mapped read-write in full."""

    __slots__ = (
        "_closed",
        "_lock",
        "_refs",
        "_unlink_on_close",
        "base",
        "fd",
        "mm",
        "path",
        "size",
    )

    def __init__(self, path: Path, base: int, fd: int, size: int) -> None:
        self.path = path
        self.base = base  # first offset this file holds (bytes for the log, entries for queues)
        self.fd = fd
        self.size = size
        self.mm = mmap.mmap(fd, size)
        self._refs = 1
        self._lock = threading.Lock()
        self._closed = False
        self._unlink_on_close = False

    @classmethod
    def create(cls, path: Path, base: int, size: int, head: bytes = b"") -> MappedFile:
        """Create, reserve and map a file. It is built under a temporary name and renamed into
        place, so a crash mid-creation never leaves a short file under a real name; ``head``
        (a file header) is written before the rename, so a killed process never leaves a file
        without its header either."""
        tmp = path.with_name(path.name + TMP_SUFFIX)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)
            if head:
                os.pwrite(fd, head, 0)
            os.rename(tmp, path)
        except OSError as e:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise StoreFailed(f"cannot create {path} ({size} bytes): {e}") from e
        fsync_dir(path.parent)
        return cls(path, base, fd, size)

    @classmethod
    def open(cls, path: Path, base: int) -> MappedFile:
        fd = os.open(path, os.O_RDWR)
        size = os.fstat(fd).st_size
        if size == 0:
            os.close(fd)
            raise StoreFailed(f"{path} is empty; a store file is never created empty")
        return cls(path, base, fd, size)

    # --- reference counting (a reader retains; retention releases the owner's reference) ---

    def retain(self) -> bool:
        with self._lock:
            if self._closed or self._refs == 0:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            last = self._refs == 0
        if last:
            self._really_close()

    def close(self, *, unlink: bool = False) -> None:
        """Drop the owner's reference; the mapping goes when the last reader releases."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._unlink_on_close = unlink
        self.release()

    def _really_close(self) -> None:
        self.mm.close()
        os.close(self.fd)
        if self._unlink_on_close:
            self.path.unlink(missing_ok=True)

    # --- I/O ---

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def pread(self, pos: int, n: int) -> bytes:
        return os.pread(self.fd, n, pos)
