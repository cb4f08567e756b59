"""The topic registry on real files: create, list, delete (with its fence), persistence, bad
names, the registry format before fences."""

from __future__ import annotations

from pathlib import Path

import pytest

from txbroker.errors import InvalidArgument, InvalidName, NotFound, TopicExists
from txbroker.server.topics import MAX_QUEUES, TopicRegistry
from txbroker.store import TopicFence


def test_create_list_delete_survive_reload(tmp_path: Path) -> None:
    reg = TopicRegistry(tmp_path)
    reg.load()
    reg.create("orders", 4)
    reg.create("payments", 2)
    reg.ensure_system("%HALF")
    again = TopicRegistry(tmp_path)
    again.load()
    assert [t.name for t in again.list()] == ["orders", "payments"]
    assert [t.name for t in again.list(include_system=True)] == ["%HALF", "orders", "payments"]
    assert again.get("orders").queues == 4
    again.delete("payments")
    third = TopicRegistry(tmp_path)
    third.load()
    with pytest.raises(NotFound):
        third.get("payments")


def test_create_is_idempotent_but_not_conflicting(tmp_path: Path) -> None:
    reg = TopicRegistry(tmp_path)
    first = reg.create("t", 3)
    assert reg.create("t", 3) == first
    with pytest.raises(TopicExists):
        reg.create("t", 5)


@pytest.mark.parametrize("name", ["", "a/b", "%sys", "..", "x" * 200, "-lead"])
def test_bad_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidName):
        TopicRegistry(tmp_path).create(name, 1)


@pytest.mark.parametrize("queues", [0, -1, MAX_QUEUES + 1])
def test_bad_queue_counts(tmp_path: Path, queues: int) -> None:
    with pytest.raises(InvalidArgument):
        TopicRegistry(tmp_path).create("t", queues)


def test_system_topics_cannot_be_deleted(tmp_path: Path) -> None:
    reg = TopicRegistry(tmp_path)
    reg.ensure_system("%DLQ%g")
    with pytest.raises(InvalidArgument):
        reg.delete("%DLQ%g")


def test_a_deletion_and_its_fence_are_one_durable_write(tmp_path: Path) -> None:
    reg = TopicRegistry(tmp_path)
    reg.load()
    reg.create("orders", 2)
    reg.delete("orders", TopicFence(1234, {0: 5, 1: 7}))
    again = TopicRegistry(tmp_path)
    again.load()
    assert not again.exists("orders")
    assert again.fences == {"orders": TopicFence(1234, {0: 5, 1: 7})}
    again.create("orders", 2)  # the name again; the fence stays while the topic numbers on
    again.forget_fences(["orders"])
    third = TopicRegistry(tmp_path)
    third.load()
    assert third.fences == {} and third.exists("orders")


def test_a_registry_written_before_fences_still_loads(tmp_path: Path) -> None:
    (tmp_path / "topics.json").write_text(
        '[{"name":"orders","queues":4,"created_ms":1},'
        '{"name":"%HALF","queues":1,"created_ms":1,"system":true}]'
    )
    reg = TopicRegistry(tmp_path)
    reg.load()
    assert reg.get("orders").queues == 4 and reg.fences == {}
    assert [t.name for t in reg.list(include_system=True)] == ["%HALF", "orders"]


def test_the_version_counts_creations_and_deletions_and_survives_reload(tmp_path: Path) -> None:
    reg = TopicRegistry(tmp_path)
    reg.load()
    changes: list[int] = []
    reg.on_change = changes.append
    reg.create("orders", 4)
    reg.create("orders", 4)  # a no-op: not a change
    reg.ensure_system("%HALF")
    reg.delete("orders", TopicFence(0, 10))
    reg.forget_fences(["orders"])  # the fences are not topics: no change
    assert reg.version == 3 and changes == [1, 2, 3]
    again = TopicRegistry(tmp_path)
    again.load()
    assert again.version == 3
