"""A broker's membership of its group: registered in etcd while it runs, and its role, master or
slave.

With ``--coordinator`` the broker keeps ``/txb/brokers/<group>/<id>`` under a registration
lease (its addresses, role and flushed offset), which NameServers read to tell clients where
each group's master is. The role is ``--role master`` or ``slave`` as given, or with ``auto``
follows an election on ``/txb/groups/<group>/master`` (:class:`Membership` says how). The
first registration also writes ``/txb/groups/<group>/members/<id>``, with no lease: the group's
members, whose number the election's quorum is counted against.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Final

from txbroker.cluster import (
    Coordinator,
    Election,
    Registration,
    connect_coordinator,
)
from txbroker.cluster._tasks import cancel_and_wait
from txbroker.cluster.election import watch_leader
from txbroker.cluster.routes import (
    BROKERS_PREFIX,
    BrokerInfo,
    Role,
    broker_key,
    master_key,
    member_key,
    members_prefix,
)
from txbroker.errors import CoordinationError, InvalidArgument
from txbroker.server.config import ServerConfig

__all__ = ["ROLES", "UPDATE_INTERVAL_S", "Membership", "MembershipSettings"]

log = logging.getLogger(__name__)

ROLES: Final = ("auto", "master", "slave")
# How often the registration's flushed offset is rewritten: a write to etcd a second per broker
# is nothing for etcd, and the offset is for operators and failover's choice, not for acks.
UPDATE_INTERVAL_S: Final = 1.0
# A candidate waiting for its quorum rechecks every ELIGIBILITY_RECHECK_S (0.2 s): saying why
# once every few seconds is enough for an operator reading the log.
WAITING_LOG_INTERVAL_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class MembershipSettings:
    coordinator: str  # etcd://...
    group: str
    broker_id: str
    role: str  # auto | master | slave
    address: str  # txb://host:port as clients reach it
    http: str  # http://host:port
    # How many slaves hold every acknowledged write besides the master: min-insync with sync
    # replication, 0 with async (an acknowledged write may be on the master alone).
    acked_on: int = 0

    @classmethod
    def of(cls, cfg: ServerConfig, port: int, http_port: int, tls: bool) -> MembershipSettings:
        """From the broker's settings and the ports it listens on. A broker listening on every
        address (0.0.0.0, ::) is advertised by the machine's name; its id defaults to
        ``host-port``, unique per machine."""
        assert cfg.coordinator is not None and cfg.group is not None
        host = socket.gethostname() if cfg.host in ("0.0.0.0", "::", "") else cfg.host
        where = f"[{host}]" if ":" in host else host
        replication = cfg.replication_settings()
        return cls(
            cfg.coordinator,
            cfg.group,
            cfg.broker_id or f"{host}-{port}",
            cfg.role,
            f"{'txbs' if tls else 'txb'}://{where}:{port}",
            f"{'https' if tls else 'http'}://{where}:{http_port}",
            replication.min_insync if replication.mode == "sync" else 0,
        )


class Membership:
    """Register, take the role, keep the registration current; :meth:`stop` ends all three.

    ::

        m = Membership(settings, flushed_offset=lambda: store.flushed_offset)
        await m.start()  # registered (raises if etcd cannot be reached)
        m.role  # Role.MASTER or Role.SLAVE
        await m.stop()  # the key goes now; an elected master resigns

    The registration (``txbroker/cluster/registration.py``) is updated every
    ``UPDATE_INTERVAL_S``. With ``auto`` the role follows the election
    (``txbroker/cluster/election.py``, failover.py): a slave while campaigning, master once
    elected, a slave again (campaigning again) if it steps down. Membership watches the election
    key and reports the group's master (``on_master``), campaigns only while it may lead
    (:meth:`eligible`: with sync replication it holds fresh reports from enough members to be
    sure one of them holds every acknowledged write, and it is the best of them: the most recent
    epoch history, then the highest flushed offset, then the lowest id), awaits
    ``on_elected(epoch, is_leader)`` before it says it is master, and calls ``on_step_down()``
    synchronously the moment leadership is lost.
    """

    def __init__(
        self,
        settings: MembershipSettings,
        *,
        flushed_offset: Callable[[], int],
        update_interval_s: float = UPDATE_INTERVAL_S,
        log_epoch: Callable[[], int] = lambda: 0,
        on_master: Callable[[BrokerInfo | None], None] | None = None,
        on_elected: Callable[[int, Callable[[], bool]], Awaitable[None]] | None = None,
        on_step_down: Callable[[], None] | None = None,
    ) -> None:
        if settings.role not in ROLES:
            raise InvalidArgument(f"role {settings.role!r}: expected one of {', '.join(ROLES)}")
        broker_key(settings.group, settings.broker_id)  # the names are usable as keys
        self.settings = settings
        self.role = Role.MASTER if settings.role == "master" else Role.SLAVE
        self.epoch = 0
        self._flushed_offset = flushed_offset
        self._log_epoch = log_epoch
        self._on_master = on_master
        self._on_elected = on_elected
        self._on_step_down = on_step_down
        self._update_interval_s = update_interval_s
        self._coordinator: Coordinator | None = None
        self._registration: Registration | None = None
        self._election: Election | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._waiting_logged: tuple[str, float] = ("", 0.0)  # (reason, when) last said

    @property
    def coordinator(self) -> Coordinator | None:
        """The etcd session this broker registered with, None before :meth:`start` and after
        :meth:`stop`: one connection per broker, which its console's Cluster page reads too."""
        return self._coordinator

    def info(self, seen_revision: int = 0) -> BrokerInfo:
        s = self.settings
        return BrokerInfo(
            s.group,
            s.broker_id,
            self.role,
            s.address,
            s.http,
            self._flushed_offset(),
            self.epoch,
            self._log_epoch(),
            seen_revision,
        )

    async def start(self) -> None:
        s = self.settings
        coordinator = self._coordinator = await connect_coordinator(s.coordinator)
        try:
            self._registration = Registration(
                coordinator, broker_key(s.group, s.broker_id), self.info().to_json()
            )
            await self._registration.start()
            # Unconditional and without a lease: a member stays one across restarts and
            # partitions; only an operator forgets it (``txbroker cluster forget``).
            await coordinator.put(member_key(s.group, s.broker_id), self.info().to_json())
        except BaseException:
            await coordinator.close()
            raise
        log.info(
            "registered as %s in group %s (role %s) at %s",
            s.broker_id,
            s.group,
            s.role,
            s.coordinator,
        )
        self._tasks.append(asyncio.create_task(self._keep_current(), name="txb-registration"))
        if s.role == "auto":
            if self._on_master is not None:
                self._tasks.append(asyncio.create_task(self._watch_master(), name="txb-master"))
            self._tasks.append(asyncio.create_task(self._campaign(), name="txb-election"))

    async def _campaign(self) -> None:
        assert self._coordinator is not None
        s = self.settings
        value = replace(self.info(), role=Role.MASTER).to_json()
        election = self._election = Election(
            self._coordinator,
            master_key(s.group),
            value,
            on_step_down=self._stepped_down,
            eligible=self.eligible if self._on_elected is not None else None,
        )
        while True:
            term = await election.campaign()
            if self._on_elected is not None:
                try:
                    await self._on_elected(term.epoch, election.is_leader)
                except Exception:
                    log.exception("cannot take over as master of %s; resigning", s.group)
                    await election.resign()
                    continue
            if election.stepped_down.is_set():  # lost while taking over
                continue
            self._become(Role.MASTER, term.epoch)
            await self._publish()
            await election.stepped_down.wait()
            self._become(Role.SLAVE, 0)
            await self._publish()

    def _stepped_down(self, _reason: str) -> None:
        if self._on_step_down is not None:
            self._on_step_down()

    async def eligible(self, vacant_since: int) -> bool:
        """Whether this broker may campaign now, the master key vacant since revision
        ``vacant_since`` (election.py).

        An acknowledged write is on the old master and (sync replication) on ``acked_on``
        slaves, any of the group's other members. Of the N members (``/txb/groups/<g>/members``)
        the candidate needs **fresh** reports, registrations whose offsets were read after
        etcd reached ``vacant_since`` (``BrokerInfo.seen_revision``; the old master stopped
        acknowledging before its lease ended, so before the key went), from at least
        N - acked_on of them, itself included: every set of ``acked_on`` members
        besides the old master then meets the fresh ones. And it must be the best of every
        slave registered: the most recent epoch history, then the most log flushed, then the
        lowest id. A registration with role master (a dead master's, lingering until its lease
        ends) is no candidate. With async replication (``acked_on`` 0) the quorum is not asked
        for: an acknowledged write may be on the old master alone, and no choice can keep it."""
        assert self._coordinator is not None
        await self._publish()  # this broker's offset as it is now, for the others to compare
        me = self.info()
        mine = (me.log_epoch, me.flushed_offset)
        listing = await self._coordinator.list_prefix(f"{BROKERS_PREFIX}{me.group}/")
        fresh = {me.broker_id}
        for kv in listing.items:
            try:
                other = BrokerInfo.from_json(kv.value)
            except CoordinationError:
                continue
            if other.broker_id == me.broker_id or other.role is Role.MASTER:
                continue
            if other.seen_revision >= vacant_since:
                fresh.add(other.broker_id)
            theirs = (other.log_epoch, other.flushed_offset)
            if theirs > mine or (theirs == mine and other.broker_id < me.broker_id):
                self._say_waiting(
                    f"rival {other.broker_id}",
                    f"{other.broker_id} holds more (epoch {theirs[0]}, offset {theirs[1]} "
                    f"against {mine[0]}, {mine[1]})",
                )
                return False
        k = self.settings.acked_on
        if k == 0:
            return True
        members = await self._coordinator.list_prefix(members_prefix(me.group))
        names = {kv.key.rsplit("/", 1)[1] for kv in members.items} | {me.broker_id}
        needed = len(names) - k
        have = fresh & names
        if len(have) < needed:
            self._say_waiting(
                f"quorum missing {sorted(names - have)}",
                f"waiting for fresh reports from {needed} of the {len(names)} members (an "
                f"acknowledged write is on {k} slave(s) besides the master): have "
                f"{', '.join(sorted(have))}; missing {', '.join(sorted(names - have))}",
            )
            return False
        return True

    def _say_waiting(self, reason: str, why: str) -> None:
        """Log ``why`` this broker does not campaign: when the ``reason`` changes, and every
        ``WAITING_LOG_INTERVAL_S`` while it stays (it is rechecked five times a second, and
        the offsets in ``why`` move with every write)."""
        last_reason, last_s = self._waiting_logged
        now = time.monotonic()
        if reason == last_reason and now - last_s < WAITING_LOG_INTERVAL_S:
            return
        self._waiting_logged = (reason, now)
        log.info(
            "%s of group %s not campaigning yet: %s",
            self.settings.broker_id,
            self.settings.group,
            why,
        )

    async def _watch_master(self) -> None:
        """Tell ``on_master`` who leads the group (another broker), or that none does."""
        assert self._coordinator is not None and self._on_master is not None
        async for kv in watch_leader(self._coordinator, master_key(self.settings.group)):
            info: BrokerInfo | None = None
            if kv is not None:
                try:
                    info = BrokerInfo.from_json(kv.value)
                except CoordinationError:
                    log.warning("the election key of %s holds no broker", self.settings.group)
            if info is not None and info.broker_id == self.settings.broker_id:
                continue  # its own term: failover.py is told by on_elected
            self._on_master(info)

    def _become(self, role: Role, epoch: int) -> None:
        if role is self.role and epoch == self.epoch:
            return
        self.role, self.epoch = role, epoch
        log.warning(
            "broker %s of group %s is now %s%s",
            self.settings.broker_id,
            self.settings.group,
            role.value,
            f" (epoch {epoch})" if epoch else "",
        )

    async def _publish(self) -> None:
        if self._registration is None or self._coordinator is None:
            return
        with contextlib.suppress(CoordinationError):  # the next round writes it again
            # Read etcd first, the offsets after: a report whose seen revision follows a master
            # key's deletion holds every write that master acknowledged with this broker's
            # copy, however late the put below arrives. (One read a second: nothing for etcd.)
            master = await self._coordinator.list_prefix(master_key(self.settings.group))
            seen = master.revision
            await self._registration.update(self.info(seen).to_json())

    async def _keep_current(self) -> None:
        while True:
            await asyncio.sleep(self._update_interval_s)
            await self._publish()

    async def stop(self) -> None:
        """Unregister (and resign, if elected): the keys go now, so clients move on at once."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            await cancel_and_wait(task)
        try:
            if self._election is not None:
                with contextlib.suppress(CoordinationError):
                    await self._election.resign()
            if self._registration is not None:
                with contextlib.suppress(CoordinationError):
                    await self._registration.stop()
        finally:
            coordinator, self._coordinator = self._coordinator, None
            if coordinator is not None:
                await coordinator.close()
