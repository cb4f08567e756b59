"""Message and transaction ids: the UUIDv7 layout, unique, time-ordered, and not repeated by a
forked child."""

from __future__ import annotations

import itertools
import os
import time
import uuid

from txbroker.protocol.ids import id_time_ms, new_id


def test_ids_are_uuid7_hex_with_their_time() -> None:
    before = time.time_ns() // 1_000_000
    ids = [new_id() for _ in range(10_000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    for i in ids:
        assert len(i) == 32 and i == i.lower()
        u = uuid.UUID(hex=i)
        assert u.version == 7 and u.variant == uuid.RFC_4122
        assert before <= id_time_ms(i) <= after
    # Ordered by time first: an id made in a later millisecond sorts after every earlier one.
    times = [id_time_ms(i) for i in ids]
    assert times == sorted(times)
    # The low 62 bits are the process's random number plus the counter: consecutive ids count up.
    lows = [int(i, 16) & ((1 << 62) - 1) for i in ids]
    assert all((b - a) % (1 << 62) == 1 for a, b in itertools.pairwise(lows))
    counters = [int(i[13:16], 16) for i in ids]
    assert all((b - a) % 4096 == 1 for a, b in itertools.pairwise(counters))


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        try:
            os.write(w, new_id().encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        child = os.read(r, 64).decode()
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    mine = new_id()
    # Same counter and number, the child's next id would end as the parent's next does.
    assert len(child) == 32 and child[16:] != mine[16:]
