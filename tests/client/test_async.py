"""`AsyncClient` has every method of `Client`, with the same parameters, and answers the same."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect

import httpx
import numpy as np

from service.client import AsyncClient, Client, Layer, Nodes
from service.zoo.lenet import samples_dir
from tests.reliability.live_server import LiveServer

DIGITS = [samples_dir() / f"digit_{i}.png" for i in range(10)]


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") and name not in ("close", "aclose")
    }


def test_the_two_clients_have_the_same_methods_and_parameters() -> None:
    sync, aio = public_methods(Client), public_methods(AsyncClient)
    assert sync.keys() == aio.keys()
    for name, signature in sync.items():
        assert list(signature.parameters) == list(aio[name].parameters), name
        for param in signature.parameters.values():
            assert param.default == aio[name].parameters[param.name].default, (name, param.name)
        if name != "__init__":
            assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name


def test_concurrent_async_calls_answer_as_the_sync_client(live: LiveServer) -> None:
    async def go() -> tuple[list[str], list[np.ndarray]]:
        async with AsyncClient(live.base_url) as client:
            predictions = await asyncio.gather(*(client.predict("lenet", d) for d in DIGITS))
            activations = await asyncio.gather(*(client.activations("lenet", d, ["fc2"]) for d in DIGITS))
        return [p.labels()[0] for p in predictions], [a.output("fc2") for a in activations]

    labels, features = asyncio.run(go())
    assert labels == [str(i) for i in range(10)]
    with Client(live.base_url) as client:
        for digit, mine in zip(DIGITS, features, strict=True):  # the server may have batched the concurrent ones
            alone = client.activations("lenet", digit, ["fc2"]).output("fc2")
            np.testing.assert_allclose(mine, alone, rtol=1e-5, atol=1e-5)
        layers = client.layers("lenet")

    async def introspect() -> list[Layer]:
        async with AsyncClient(live.base_url) as client:
            return await client.layers("lenet")

    assert [dataclasses.asdict(x) for x in asyncio.run(introspect())] == [dataclasses.asdict(x) for x in layers]


def test_nodes_answer_as_raw_http_on_both_clients(live: LiveServer) -> None:
    raw = httpx.get(f"{live.base_url}/models/lenet/nodes", timeout=30).json()
    with Client(live.base_url) as client:
        nodes = client.nodes("lenet")

    async def fetch() -> Nodes:
        async with AsyncClient(live.base_url) as client:
            return await client.nodes("lenet")

    assert dataclasses.asdict(nodes) == raw
    assert asyncio.run(fetch()) == nodes
