"""The OpenAPI document keeps every operation and schema it had: additions are free, changes are deliberate.

`openapi_contract.json` is the document as released. An operation or component that changes
or disappears fails here; if the change is meant (API.md allows it, or it is a new version of
an operation), regenerate the file with `python -m tests.api.test_openapi_contract` and say
why in the commit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from service.main import create_app

CONTRACT = Path(__file__).with_name("openapi_contract.json")


def live_document() -> dict[str, Any]:
    document: dict[str, Any] = create_app().openapi()
    return document


def covers(live: Any, released: Any) -> bool:
    """`live` keeps everything `released` says: objects may gain keys (a new optional field, a new
    response), lists (required fields, enums, parameters) and values must be equal."""
    if isinstance(released, dict):
        return isinstance(live, dict) and all(k in live and covers(live[k], v) for k, v in released.items())
    return bool(live == released)


def test_every_released_operation_is_kept() -> None:
    released = json.loads(CONTRACT.read_text())
    live = live_document()
    changed = [
        f"{method.upper()} {path}"
        for path, operations in released["paths"].items()
        for method, operation in operations.items()
        if not covers(live["paths"].get(path, {}).get(method), operation)
    ]
    assert not changed, f"operations changed or removed: {changed}"


def test_every_released_schema_is_kept() -> None:
    released = json.loads(CONTRACT.read_text())["components"]["schemas"]
    live = live_document()["components"]["schemas"]
    changed = [name for name, schema in released.items() if not covers(live.get(name), schema)]
    assert not changed, f"schemas changed or removed: {changed}"


def test_a_changed_schema_is_noticed() -> None:
    released = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    assert covers({**released, "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}, released)
    assert not covers({**released, "required": ["a", "b"]}, released)
    assert not covers({**released, "properties": {"a": {"type": "integer"}}}, released)


def test_the_served_document_is_the_generated_one() -> None:
    with TestClient(create_app()) as client:
        served = client.get("/openapi.json").json()
    assert served == json.loads(json.dumps(live_document()))


if __name__ == "__main__":
    CONTRACT.write_text(json.dumps(live_document(), indent=1, sort_keys=True) + "\n")
