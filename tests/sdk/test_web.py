"""TxbService, the FastAPI / Starlette integration, in real apps served by uvicorn (lifespan on)
against a real broker process: what its lifespan starts and in which order, the dependencies
route handlers get, a shutdown bounded even with the broker gone, and failing fast at start.

No ``from __future__ import annotations`` here: FastAPI reads the routes' annotations, and those
name this file's local services (``Depends(txb.session)``), which a string could not resolve."""

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated

import httpx
import pytest
import sqlalchemy as sa
import uvicorn
from fastapi import Depends, FastAPI
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.applications import Starlette
from starlette.types import ASGIApp

from tests.conftest import BrokerProcess, free_port
from txbroker_sdk import Client, ConsumedMessage, TxbError, TxbService, TxPublisher
from txbroker_sdk.errors import InvalidArgument, NotStarted

GROUP = "web-svc"
SECRET = "s3cret"
# The first back-check 300 ms after a PREPARE left open.
FAST = "tx_timeout_ms = 300\ncheck_backoff_base_ms = 100\ncheck_backoff_cap_ms = 200\n"
WITHIN_S = 30.0

notes = sa.Table(
    "notes",
    sa.MetaData(),
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("seen", sa.Integer, nullable=False, server_default="0"),
)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    cfg = tmp_path / "broker.toml"
    cfg.write_text(FAST)
    b = BrokerProcess(tmp_path / "broker", "--config", str(cfg), "--tx-secret", f"{GROUP}={SECRET}")
    b.start()
    yield b
    b.stop()


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the test process keeps its signals
        yield


@contextlib.asynccontextmanager
async def served(app: ASGIApp, port: int) -> AsyncIterator[_Server]:
    """``app`` served by uvicorn with its lifespan, as ``uvicorn module:app`` would."""
    server = _Server(uvicorn.Config(app, port=port, lifespan="on", log_level="warning"))
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(WITHIN_S):
            while not server.started:
                assert not task.done(), "the app did not start"
                await asyncio.sleep(0.01)  # uvicorn offers no "started" event to await
        yield server
    finally:
        server.should_exit = True
        await task


def _service(broker: BrokerProcess, db: str, port: int, **kw: object) -> TxbService:
    return TxbService(
        broker=broker.url,
        database=db,
        producer_group=GROUP,
        secret=SECRET,
        public_url=f"http://127.0.0.1:{port}",
        create_tables=notes.metadata,
        **kw,  # type: ignore[arg-type]
    )


async def test_lifespan_wires_a_fastapi_service(broker: BrokerProcess, sqlite_url: str) -> None:
    port = free_port()
    txb = _service(broker, sqlite_url, port)
    app = FastAPI(lifespan=txb.lifespan)
    applied: list[str] = []
    all_applied = asyncio.Event()

    @txb.transactional("notes", key=lambda note: note["id"])
    async def add_note(session: AsyncSession, note_id: str) -> dict[str, str]:
        await session.execute(notes.insert().values(id=note_id))
        return {"id": note_id}

    @txb.subscriber("notes", group="readers")
    async def read(session: AsyncSession, msg: ConsumedMessage) -> None:
        note_id = json.loads(msg.body)["id"]
        await session.execute(notes.update().where(notes.c.id == note_id).values(seen=1))
        applied.append(note_id)
        if len(applied) == 2:
            all_applied.set()

    @app.post("/notes/{note_id}", status_code=201)
    async def post_note(note_id: str) -> dict[str, str]:
        return await add_note(note_id)

    @app.get("/notes/{note_id}")
    async def get_note(
        note_id: str,
        session: Annotated[AsyncSession, Depends(txb.session)],
        publisher: Annotated[TxPublisher, Depends(txb.publisher)],
    ) -> dict[str, object]:
        seen = await session.scalar(sa.select(notes.c.seen).where(notes.c.id == note_id))
        return {"seen": seen, "check_url": publisher.check_url}

    with pytest.raises(NotStarted):  # decorated at import time, bound at start
        await add_note("early")
    with pytest.raises(NotStarted):
        txb.publisher()

    base = f"http://127.0.0.1:{port}"
    async with served(app, port), httpx.AsyncClient(base_url=base, timeout=WITHIN_S) as http:
        # The publisher was built with the URL of the endpoint the lifespan mounted.
        publisher, client = txb.publisher(), txb.client()
        assert publisher.check_url == f"{base}/txb/check"
        assert client.connected

        # The endpoint answers the broker: a transaction left open is checked there; no
        # barrier row, so ROLLBACK.
        tx = await client.prepare(
            "notes", b"{}", producer_group=GROUP, check_url=publisher.check_url, timeout_ms=100
        )
        async with asyncio.timeout(WITHIN_S):
            while True:  # the broker checks in its own time; its answer is the state
                if (await client.show_transaction(tx.tx_id)).state == "rolled_back":
                    break
                await asyncio.sleep(0.05)

        # A route's @transactional call publishes; the service's subscriber applies it once.
        for note_id in ("a", "b"):
            assert (await http.post(f"/notes/{note_id}")).status_code == 201
        async with asyncio.timeout(WITHIN_S):
            await all_applied.wait()
        res = await http.get("/notes/a")  # through Depends(txb.session), Depends(txb.publisher)
        assert res.json() == {"seen": 1, "check_url": f"{base}/txb/check"}
        assert sorted(applied) == ["a", "b"]

        # Decorated while running: bound at once. Subscribing now is refused (too late).
        @txb.transactional("notes")
        async def add_later(session: AsyncSession) -> dict[str, str]:
            return {"id": "later"}

        assert await add_later() == {"id": "later"}
        with pytest.raises(InvalidArgument, match="before the service starts"):
            txb.subscriber("notes", group="late")

    # Shut down: unbound, unmounted, disconnected; a second start would mount it again.
    assert not client.connected
    assert not any(getattr(r, "path", None) == "/txb/check" for r in app.router.routes)
    with pytest.raises(NotStarted):
        await add_note("late")
    with pytest.raises(NotStarted):
        txb.client()


class Stubborn:
    """A runner that ignores its stop event (a relay stuck on a dead connection, say)."""

    cancelled = False

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def test_shutdown_is_bounded_when_the_broker_is_gone(
    broker: BrokerProcess, sqlite_url: str
) -> None:
    port = free_port()
    stubborn = Stubborn()
    txb = _service(
        broker, sqlite_url, port, shutdown_timeout_s=2.0, relay=lambda client, engine: stubborn
    )

    @txb.subscriber("notes", group="readers")
    async def read(session: AsyncSession, msg: ConsumedMessage) -> None:
        pass

    app = Starlette(lifespan=txb.lifespan)  # Starlette as well as FastAPI
    async with served(app, port):
        await txb.client().ping()
        broker.kill()  # the subscribers now retry their fetches against nothing
        started = time.monotonic()
    took = time.monotonic() - started
    assert stubborn.cancelled  # given the bound to stop, then cancelled
    assert 2.0 <= took < 2.0 + 3.0  # the bound, and a margin for a busy machine


async def test_a_database_without_the_tables_fails_the_start(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    txb = _service(broker, f"sqlite:///{tmp_path / 'new.db'}", 8000)
    with pytest.raises(TxbError, match="txbroker db upgrade"):
        async with txb.lifespan(FastAPI()):
            pass
    with pytest.raises(NotStarted):
        txb.engine()

    # migrate=True creates them (development and examples).
    txb = _service(broker, f"sqlite:///{tmp_path / 'new.db'}", 8000, migrate=True)
    app = FastAPI()
    async with txb.lifespan(app):
        assert txb.publisher().check_url == "http://127.0.0.1:8000/txb/check"


async def test_a_broker_that_cannot_be_reached_fails_the_start(sqlite_url: str) -> None:
    txb = TxbService(
        broker=f"txb://127.0.0.1:{free_port()}", database=sqlite_url, connect_timeout_s=1.0
    )
    started = time.monotonic()
    with pytest.raises(TxbError, match="cannot reach the broker"):
        async with txb.lifespan(FastAPI()):
            pass
    assert time.monotonic() - started < 1.0 + 3.0


def test_misconfiguration_is_refused_when_declared() -> None:
    with pytest.raises(InvalidArgument, match="secret"):
        TxbService(broker="txb://b", database="sqlite://", producer_group=GROUP)
    txb = TxbService(broker="txb://b", database="sqlite://")  # a service that only consumes
    with pytest.raises(InvalidArgument, match="producer_group"):
        txb.transactional("notes")


async def test_the_client_dependency_and_plain_calls(
    broker: BrokerProcess, sqlite_url: str
) -> None:
    txb = TxbService(broker=broker.url, database=sqlite_url)
    app = FastAPI(lifespan=txb.lifespan)

    @app.get("/topics")
    async def topics(client: Annotated[Client, Depends(txb.client)]) -> list[str]:
        return [t.topic for t in await client.list_topics()]

    port = free_port()
    async with (
        served(app, port),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        assert (await http.get("/topics")).status_code == 200
        with pytest.raises(InvalidArgument, match="no producer_group"):
            txb.publisher()  # a service without a producer group has no publisher
        async with txb.engine().connect() as conn:
            assert await conn.scalar(sa.select(1)) == 1
