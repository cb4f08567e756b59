"""A full disk under the broker: its data directory on a small tmpfs of its own (sized for the
rounds), filled to the last byte (ENOSPC) under load, then emptied again.

The store creates every file an append needs before it writes, so a full disk shows when the
log has to roll. Mounting needs root (CAP_SYS_ADMIN); without it (or with ``Sizes.disk =
"rlimit"``) the full disk is simulated by lowering the broker's RLIMIT_FSIZE, so its writes fail
with EFBIG as they would on a disk without space. :func:`disk_full` runs the rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import resource
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

from txbroker.chaos.figures import Figures
from txbroker.chaos.scenarios import Sizes, Skip, load_round, out_of_time
from txbroker.chaos.world import World, WorldSpec

__all__ = ["disk_full", "small_disk"]

# The broker's files at start take about 80 MiB here (two 5 MiB segments, a 5.8 MiB file per
# queue of orders, audit, plain and the internal topics, the key index); each round adds up to
# two segments of big bodies before the refusal, and the round's load. Without room for that
# the log itself fills the disk after a few rounds (a first run found it: stuck at round 16 of
# 20 on a fixed 160 MiB). The tmpfs is memory: at most 2 GiB, enough for 160 rounds.
DISK_BASE_MIB: Final = 96
DISK_ROUND_MIB: Final = 12
DISK_MAX_MIB: Final = 2048
SEGMENT_MIB: Final = 5  # the smallest the broker takes: the log rolls after little traffic
PAD_BYTES: Final = 64 * 1024
# Sends while the disk is full, at most: 25 MiB of bodies, five times what must be written
# before the log needs a segment that cannot be created.
FULL_SENDS: Final = 400
FILL_CHUNK: Final = 1 << 20
# The simulated full disk: no write may reach past 1 MiB of a file; a 5 MiB segment is written
# past that within its first fifth.
FSIZE_LIMIT: Final = 1 << 20


@contextlib.asynccontextmanager
async def small_disk(root: Path, sizes: Sizes, f: Figures) -> AsyncIterator[WorldSpec]:
    mount = root / "disk"
    mount.mkdir(parents=True, exist_ok=True)
    mib = min(DISK_BASE_MIB + DISK_ROUND_MIB * sizes.rounds, DISK_MAX_MIB)
    opts = f"size={mib}m,mode=0755"
    res = await asyncio.to_thread(
        subprocess.run,
        ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if sizes.disk == "rlimit" or res.returncode != 0:
        why = "asked for" if sizes.disk == "rlimit" else f"no tmpfs: {res.stderr.strip()}"
        if sizes.disk == "tmpfs":
            raise Skip(f"cannot mount a {mib} MiB tmpfs (needs root): {res.stderr.strip()}")
        if res.returncode == 0:
            await asyncio.to_thread(subprocess.run, ["umount", "-l", str(mount)])
        f.notes.append(f"the full disk simulated with RLIMIT_FSIZE ({why})")
        yield WorldSpec(root, broker_extra=("--segment-mib", str(SEGMENT_MIB)))
        return
    f.notes.append(f"the broker's disk: a {mib} MiB tmpfs")
    try:
        yield WorldSpec(
            root,
            data_dir=mount / "broker",
            broker_extra=("--segment-mib", str(SEGMENT_MIB)),
            disk=mount,
        )
    finally:
        await asyncio.to_thread(subprocess.run, ["umount", "-l", str(mount)], capture_output=True)


def _fill(path: Path) -> int:
    """Write ``path`` until the filesystem is full; returns the bytes written. Unbuffered: a
    buffered file would fail again flushing its rest at close."""
    written = 0
    with open(path, "wb", buffering=0) as out:
        for size in (FILL_CHUNK, 4096, 512):  # down to the last crumbs of space
            chunk = bytes(size)
            while True:
                try:
                    n = out.write(chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
                written += n or 0
                if not n:
                    break
    return written


async def disk_full(world: World, sizes: Sizes, f: Figures) -> None:
    """Each round: load, fill the disk, send big bodies until the broker refuses one with
    ``STORE_FAILED`` (one fault), empty the disk. The next round's load shows appends resumed.
    A broker that dies of the full disk is a finding: noted, and started again.

    The plain producer sends 64 KiB bodies until the broker answers ``STORE_FAILED`` (two 5 MiB
    segments at most, the next one being preallocated); then the filler is removed. Without
    root the limit is RLIMIT_FSIZE at 1 MiB (``prlimit``, Linux, as
    tests/server/test_failed_append.py does): a failed write makes the store refuse every
    append until it is reopened (its state FAILED), so such a round ends with the limit raised
    and the broker restarted."""
    disk = world.spec.disk
    started = time.monotonic()
    for r in range(sizes.rounds):
        if out_of_time(started, sizes, f) or not await load_round(world, sizes, f):
            break
        filler = disk / "filler" if disk is not None else None
        refused = world.refused
        try:
            if filler is not None:
                await asyncio.to_thread(_fill, filler)
            else:
                _limit_broker(world, FSIZE_LIMIT)
            world.pad = PAD_BYTES
            await world.produce(FULL_SENDS)
            felt = await world.progress.wait_for(
                lambda refused=refused: world.refused > refused or not world.broker_running,  # type: ignore[misc]
                sizes.round_timeout_s,
            )
        finally:
            world.pad = 0
            world.quota = world.sent  # what was not sent yet is not sent
            if filler is not None:
                filler.unlink(missing_ok=True)
            elif world.broker_running:
                _limit_broker(world, resource.RLIM_INFINITY)
        if filler is None and world.broker_running:
            # A failed write leaves the store FAILED until it is reopened: an operator's restart.
            await asyncio.to_thread(world.broker.stop)
            await world.start_broker()
        if not world.broker_running:
            code = world.broker.proc.returncode if world.broker.proc else None
            f.notes.append(f"round {r + 1}: the broker exited ({_exit(code)}) on a full disk")
            f.anomalies += 1
            await world.start_broker()
        elif felt:
            f.struck()
        else:
            f.notes.append(f"round {r + 1}: no STORE_FAILED within {sizes.round_timeout_s:.0f} s")
        f.rounds += 1
    f.notes.append(f"{world.refused} sends refused with STORE_FAILED")


def _limit_broker(world: World, soft: int) -> None:
    """Set the running broker's RLIMIT_FSIZE (as a quota would be reached, or lifted)."""
    assert world.broker.proc is not None
    pid = world.broker.proc.pid
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY and (soft == resource.RLIM_INFINITY or soft > hard):
        soft = hard
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))


def _exit(code: int | None) -> str:
    if code is not None and code < 0:
        return signal.Signals(-code).name
    return f"code {code}"
