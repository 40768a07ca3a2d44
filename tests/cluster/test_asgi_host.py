"""hookserve's app hosted in-process as each replica hosts it: lifespan, requests replayed whole, shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest
from fastapi import FastAPI, Request

from service.cluster.asgi_host import AppHost, LifespanError
from service.cluster.messages import ForwardRequest
from service.config import Settings
from service.main import create_app
from tests.conftest import write_lenet


def test_hookserve_runs_in_process_with_limits_and_errors_as_over_http(tmp_path: Path) -> None:
    (tmp_path / "models.toml").write_text(write_lenet(tmp_path))
    settings = Settings(model_dir=tmp_path, config=tmp_path / "models.toml", worker_threads=1, max_body_bytes=50_000)

    async def scenario() -> None:
        host = AppHost(create_app(settings))
        await host.start()
        assert host.running
        try:
            for _ in range(600):
                models = orjson.loads((await host.call(ForwardRequest("GET", "/models"))).body)["models"]
                if models[0]["status"] != "loading":
                    break
                await asyncio.sleep(0.1)
            assert models[0]["status"] == "ready"
            body = orjson.dumps(
                {
                    "model": "lenet",
                    "inputs": [{"tensor": {"shape": [3, 32, 32], "dtype": "float32", "data": [0.1] * 3072}}],
                    "top_k": 2,
                }
            )
            json_headers = [(b"content-type", b"application/json")]
            answer = await host.call(ForwardRequest("POST", "/predict", headers=json_headers, body=body))
            assert answer.status == 200
            assert len(orjson.loads(answer.body)["predictions"][0]["top_k"]) == 2
            query = await host.call(ForwardRequest("GET", "/models/lenet/summary", query_string=b"depth=1"))
            assert query.status == 200
            assert orjson.loads(query.body)["total_params"] > 0
            too_big = await host.call(ForwardRequest("POST", "/predict", headers=json_headers, body=b"x" * 60_000))
            assert too_big.status == 413
            bad = await host.call(ForwardRequest("POST", "/predict", headers=json_headers, body=b"{nope"))
            assert bad.status == 400
            missing = await host.call(ForwardRequest("GET", "/models/nope"))
            assert missing.status == 404
            assert missing.header(b"content-type") == b"application/json"
        finally:
            await host.stop()
        assert not host.running

    asyncio.run(scenario())


def test_state_from_the_lifespan_reaches_requests_and_failures_are_reported() -> None:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, str]]:
        yield {"greeting": "hello"}

    app = FastAPI(lifespan=lifespan)

    @app.get("/hi")
    async def hi(request: Request) -> dict[str, str]:
        return {"said": request.state.greeting, "client": str(request.client.host if request.client else None)}

    @asynccontextmanager
    async def broken(app: FastAPI) -> AsyncIterator[None]:
        raise RuntimeError("no model dir")
        yield

    async def scenario() -> None:
        host = AppHost(app)
        await host.start()
        answer = await host.call(ForwardRequest("GET", "/hi", client=("10.1.2.3", 5)))
        assert orjson.loads(answer.body) == {"said": "hello", "client": "10.1.2.3"}
        await host.stop()
        failing = AppHost(FastAPI(lifespan=broken))
        with pytest.raises(LifespanError, match="no model dir"):
            await failing.start()
        assert not failing.running

    asyncio.run(scenario())
