"""`txbroker bench instructions`: CPU instructions per message of the broker's hot path, under
callgrind.

Wall time on a shared machine moves 2x to 4x within minutes; the instruction count of the same
work does not, so this is the yardstick of the per-message cost in Python. One in-process loop:
a broker (the real ``BrokerServer``, sync flush) and one of its ``Connection`` objects fed
request frames through ``data_received``, as the event loop would, each round waiting for every
answer to be written. A round is 64 SEND frames (single sends) or 8 SEND_BATCH frames of 32
messages (batches). The loop runs under ``valgrind --tool=callgrind`` twice, with ``rounds``
rounds and with none, and the difference divided by the messages is the figure: the broker's
start-up, the imports and the first round's warm-up cancel out. Single sends vary by several
per cent from run to run (how many answers share a group commit depends on the disk's timing);
batches by about one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from txbroker.errors import InvalidArgument

__all__ = ["InstructionsResult", "bench_instructions", "format_instructions"]

SINGLE_FRAMES: Final = 64  # single sends per round: the last round's loop
BATCH_FRAMES: Final = 8  # batches per round
BATCH_MESSAGES: Final = 32  # messages per batch: `bench produce --batch 32`'s size
BODY_BYTES: Final = 1024  # 1 KiB bodies, as in `bench peers` and `bench produce`
_TOPIC: Final = "bench"
# Callgrind runs Python some 50 times slower; a group commit answers in milliseconds natively.
_ANSWER_WAIT_S: Final = 120.0
_COLLECTED: Final = re.compile(r"Collected : (\d+)")


@dataclass(frozen=True)
class InstructionsResult:
    build: str  # the build the loop imported (txbroker.runtime.build)
    rounds: int
    single_instructions_per_message: int
    batch_instructions_per_message: int


class _Sink:
    """The transport's side the connection uses: collects what it writes."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.arrived = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.written += data
        self.arrived.set()

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def pause_reading(self) -> None:
        raise AssertionError("the loop keeps fewer requests in flight than the connection's bound")

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


def _frames(kind: str) -> tuple[bytes, int, int]:
    """The request bytes of one round, how many answers and how many messages they carry."""
    from txbroker.protocol.codec import encode_frame
    from txbroker.protocol.frames import FrameKind, Opcode
    from txbroker.protocol.messages import SendBatchRequest, SendRequest, encode_body

    body = os.urandom(BODY_BYTES)
    if kind == "single":
        one = encode_body(SendRequest(_TOPIC, body))
        frames = [
            encode_frame(FrameKind.REQUEST, Opcode.SEND, i, one) for i in range(SINGLE_FRAMES)
        ]
        return b"".join(frames), SINGLE_FRAMES, SINGLE_FRAMES
    batch = encode_body(SendBatchRequest([SendRequest(_TOPIC, body)] * BATCH_MESSAGES))
    frames = [
        encode_frame(FrameKind.REQUEST, Opcode.SEND_BATCH, i, batch) for i in range(BATCH_FRAMES)
    ]
    return b"".join(frames), BATCH_FRAMES, BATCH_FRAMES * BATCH_MESSAGES


async def _loop(kind: str, rounds: int, data_dir: Path) -> None:
    from txbroker.protocol.codec import FrameDecoder
    from txbroker.protocol.frames import FrameKind
    from txbroker.protocol.messages import HelloOk
    from txbroker.server.app import BrokerServer
    from txbroker.server.config import ServerConfig
    from txbroker.server.connection import Connection
    from txbroker.store import FlushMode

    server = BrokerServer(ServerConfig(data_dir, port=0, http_port=0, flush=FlushMode.SYNC))
    await server.start()
    try:
        server.topics.create(_TOPIC, 4)
        assert server.access is not None
        conn = Connection(
            server.handlers,
            access=server.access,
            hello=lambda _: HelloOk("bench", 1),
            connections=set(),
            role=server.role,
        )
        sink = _Sink()
        conn.connection_made(sink)  # type: ignore[arg-type]
        data, answers, _ = _frames(kind)
        decoder = FrameDecoder()
        for _ in range(rounds + 1):  # the first round warms up; it runs with 0 rounds too
            conn.data_received(data)
            got = 0
            while got < answers:
                # An event, not a polling turn: the fdatasync's wall time must not add turns.
                await asyncio.wait_for(sink.arrived.wait(), _ANSWER_WAIT_S)
                sink.arrived.clear()
                frames = decoder.feed(sink.written)
                sink.written.clear()
                for f in frames:
                    if f.kind != FrameKind.RESPONSE:
                        raise AssertionError(f"an error answered a send: {f.body!r}")
                got += len(frames)
    finally:
        await server.stop()


def _collected(kind: str, rounds: int, valgrind: str, data_root: Path | None) -> tuple[int, str]:
    """Instructions of one callgrind run of the loop, and the build it imported."""
    root = Path(tempfile.mkdtemp(prefix="txb-instr-", dir=data_root))
    try:
        cmd = [
            valgrind,
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-m",
            "txbroker.bench.instructions",
            kind,
            str(rounds),
            str(root / "broker"),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        m = _COLLECTED.search(done.stderr)
        if done.returncode != 0 or m is None:
            raise RuntimeError(f"callgrind run failed ({done.returncode}): {done.stderr[-2000:]}")
        return int(m.group(1)), done.stdout.strip()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_instructions(rounds: int, data_root: Path | None = None) -> InstructionsResult:
    """Instructions per message of single sends and of batched messages, for the build that
    this interpreter imports."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise InvalidArgument("valgrind is not installed (apt-get install valgrind)")
    per: dict[str, int] = {}
    builds: set[str] = set()
    # A first run compiles the .pyc files that the measured runs then all load from the cache.
    _collected("single", 0, valgrind, data_root)
    for kind in ("single", "batch"):
        _, _, messages = _frames(kind)
        base, base_build = _collected(kind, 0, valgrind, data_root)
        full, full_build = _collected(kind, rounds, valgrind, data_root)
        per[kind] = round((full - base) / (rounds * messages))
        builds |= {base_build, full_build}
    if len(builds) != 1:
        raise RuntimeError(f"the callgrind runs imported different builds: {sorted(builds)}")
    return InstructionsResult(builds.pop(), rounds, per["single"], per["batch"])


def format_instructions(res: InstructionsResult) -> str:
    return (
        f"build: {res.build}\n"
        f"single sends:  {res.single_instructions_per_message:>9,} instructions per message\n"
        f"batches of {BATCH_MESSAGES}: {res.batch_instructions_per_message:>9,} instructions per "
        f"message\n({res.rounds} rounds minus 0 rounds, callgrind, sync flush)"
    )


def main() -> None:
    """The loop itself, run by callgrind: ``python -m txbroker.bench.instructions KIND ROUNDS
    DATA_DIR``."""
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["single", "batch"])
    p.add_argument("rounds", type=int)
    p.add_argument("data_dir", type=Path)
    args = p.parse_args()
    import uvloop  # the broker's loop

    from txbroker.runtime.build import BUILD

    print(BUILD.describe())  # what this process imports: its path may differ from its caller's
    uvloop.run(_loop(args.kind, args.rounds, args.data_dir))


if __name__ == "__main__":
    main()
