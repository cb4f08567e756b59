"""The campaign's checks see what they are for: in a world whose load went through cleanly, a
committed local transaction with no message is lost, an effect applied a second time is
duplicated, and an order whose row and barrier disagree is an anomaly."""

from __future__ import annotations

from pathlib import Path

from txbroker.chaos import Figures
from txbroker.chaos.service import EFFECTS
from txbroker.chaos.world import World, WorldSpec
from txbroker_sdk.database import create_engine
from txbroker_sdk.tables import LOCAL_TX


async def test_a_lost_message_and_a_duplicate_effect_are_counted(tmp_path: Path) -> None:
    async with World(WorldSpec(tmp_path, settle_s=5)) as world:
        await world.produce(20)
        assert await world.wait_plain(20, 60)
        await world.stop_load()
        orders, billing = create_engine(world.orders_url), create_engine(world.billing_url)
        try:
            async with orders.begin() as conn:
                ghost = {"tx_id": "ghost-tx", "state": "committed", "key": "ghost"}
                await conn.execute(LOCAL_TX.insert().values(ghost))
            async with billing.begin() as conn:
                await conn.execute(EFFECTS.insert().values(ref="plain:p1"))
        finally:
            await orders.dispose()
            await billing.dispose()
        f = Figures("checks")
        await world.settle_and_check(f)
    assert (f.lost, f.duplicated) == (1, 1), f.as_dict()
    assert f.anomalies == 1 and any("row and barrier disagree" in n for n in f.notes), f.notes
    assert any("not settled in 5 s" in n and "1 effects missing" in n for n in f.notes), f.notes
