"""GET /v1/openapi.json: an OpenAPI 3.1 document of every messaging endpoint, generated from
the types the broker decodes, each operation with an operationId and every $ref resolving."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.conftest import BrokerProcess
from txbroker.server.http.openapi import openapi_document


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


async def test_the_document_describes_every_endpoint(
    api_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    r = await http.get("/v1/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc == json.loads(json.dumps(openapi_document()))
    assert doc["openapi"] == "3.1.0"
    ops = {(path, method): op for path, item in doc["paths"].items() for method, op in item.items()}
    assert set(ops) == {
        ("/v1/topics/{topic}/messages", "post"),
        ("/v1/transactions", "post"),
        ("/v1/transactions/{tx_id}/commit", "post"),
        ("/v1/transactions/{tx_id}/rollback", "post"),
        ("/v1/producer-groups/{group}/checks", "post"),
        ("/v1/transactions/{tx_id}/unknown", "post"),
        *(
            (f"/v1/groups/{{group}}/topics/{{topic}}/{action}", "post")
            for action in ("receive", "ack", "nack", "extend")
        ),
    }
    ids = [op["operationId"] for op in ops.values()]
    assert len(set(ids)) == len(ids) == 10
    schemas = doc["components"]["schemas"]
    for ref in _refs(doc):
        assert ref.startswith("#/components/schemas/") and ref.split("/")[-1] in schemas
    # Strict decoding is in the schema too: an unknown field is refused, not ignored.
    assert schemas["PublishMessage"]["additionalProperties"] is False
    assert schemas["PublishMessage"]["required"] == ["body"]
    assert schemas["PrepareTransaction"]["additionalProperties"] is False
    assert set(schemas["TxEndResponse"]["required"]) >= {"tx_id", "state"}
    # Receiving's bounds are in the schema, so a client learns them from it.
    receive = schemas["ReceiveRequest"]
    assert receive["additionalProperties"] is False
    assert set(receive["required"]) == {"max", "wait_ms", "invisible_ms"}
    assert (receive["properties"]["max"]["minimum"], receive["properties"]["max"]["maximum"]) == (
        1,
        1024,
    )
    assert "pattern" in schemas["ReceiptList"]["properties"]["receipts"]["items"]
    assert schemas["PullChecks"]["additionalProperties"] is False
    assert schemas["PullChecks"]["properties"]["max"]["maximum"] == 1024
    assert schemas["CheckRequest"]["required"] == [
        "tx_id",
        "topic",
        "producer_group",
        "check_count",
    ]
    for op in ops.values():
        assert "application/problem+json" in op["responses"]["401"]["content"]
