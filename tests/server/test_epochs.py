"""The master epoch history a failover leaves in every broker's meta/epochs.json: where each
master's writes begin, and where a given epoch's writes end (what a rejoining slave cuts to)."""

from __future__ import annotations

from pathlib import Path

import pytest

from txbroker.errors import CorruptLog
from txbroker.server.replication.epochs import EPOCHS_FILE, EpochHistory


def test_an_epoch_ends_where_the_next_one_known_begins(tmp_path: Path) -> None:
    h = EpochHistory(tmp_path)
    h.begin(10, 0)
    h.begin(25, 900)
    h.begin(40, 1500)
    assert h.last_epoch == 40
    assert h.end_of(10) == 900
    assert h.end_of(25) == 1500
    assert h.end_of(40) is None  # the current epoch: nothing after it
    # An epoch this history never saw (an old master's own term that no slave followed):
    # its writes end where the first later epoch here begins.
    assert h.end_of(30) == 1500
    assert h.end_of(0) == 0  # a log from before any election holds nothing the group keeps


def test_the_history_survives_a_restart_and_a_slave_adopts_its_masters(tmp_path: Path) -> None:
    master = EpochHistory(tmp_path / "m")
    master.begin(3, 0)
    master.begin(7, 4096)
    assert EpochHistory(tmp_path / "m").load().entries == [(3, 0), (7, 4096)]
    slave = EpochHistory(tmp_path / "s").load()
    assert slave.entries == [] and slave.last_epoch == 0
    assert slave.adopt([[7, 4096], [3, 0]])  # as decoded from the wire, in any order
    assert not slave.adopt([(3, 0), (7, 4096)])  # unchanged: not written again
    assert EpochHistory(tmp_path / "s").load().entries == [(3, 0), (7, 4096)]


def test_an_epoch_never_goes_back(tmp_path: Path) -> None:
    h = EpochHistory(tmp_path)
    h.begin(5, 0)
    with pytest.raises(ValueError, match="epoch 5 is not after 5"):
        h.begin(5, 10)
    assert h.entries == [(5, 0)]


def test_a_damaged_history_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / EPOCHS_FILE).write_bytes(b"{garbage")
    with pytest.raises(CorruptLog, match="not an epoch history"):
        EpochHistory(tmp_path).load()
