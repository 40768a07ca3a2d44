"""Request ids and the JSON access log: one line per request, the id echoed as a header."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.testclient import TestClient

from service.api.observability import (
    JsonFormatter,
    JsonHandler,
    configure_logging,
    current_request_id,
    install_observability,
    set_request_model,
)
from service.config import Settings
from service.main import create_app
from tests.conftest import wait_settled

HEX_ID = re.compile(r"[0-9a-f]{32}")


class LogLines:
    """The JSON lines `configure_logging` writes, parsed."""

    def __init__(self, stream: io.StringIO) -> None:
        self.stream = stream

    def all(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines() if line]

    def access(self) -> list[dict[str, Any]]:
        return [line for line in self.all() if line["logger"] == "hookserve.access"]

    def clear(self) -> None:
        self.stream.seek(0)
        self.stream.truncate()


@pytest.fixture
def logs() -> Iterator[LogLines]:
    """JSON logging into a buffer; the root and uvicorn loggers are put back afterwards."""
    names = ("", "uvicorn", "uvicorn.error", "uvicorn.access")
    saved = {
        n: (logging.getLogger(n).level, list(logging.getLogger(n).handlers), logging.getLogger(n).propagate)
        for n in names
    }
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    yield LogLines(stream)
    for n, (level, handlers, propagate) in saved.items():
        logger = logging.getLogger(n)
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate = propagate


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """One tiny model, a 2 KiB body limit, observability installed."""
    config = tmp_path / "models.toml"
    config.write_text(
        '[[models]]\nname = "tiny"\nsource = "python"\narchitecture = "service.zoo.lenet:LeNet"\n'
        "input_size = [3, 32, 32]\n"
    )
    settings = Settings(model_dir=tmp_path, config=config, worker_threads=1, max_body_bytes=2048)
    app = create_app(settings)
    install_observability(app, settings)
    with TestClient(app) as c:
        deadline = time.monotonic() + 30
        while c.get("/models").json()["models"][0]["status"] == "loading":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert c.get("/models").json()["models"][0]["status"] == "ready"
        yield c


def small_app() -> FastAPI:
    """Routes that name a model from the 'body', fail, report the context's id, and sit under a prefix."""
    app = FastAPI()

    @app.post("/run")
    async def run(request: Request) -> dict[str, str | None]:
        set_request_model(request, "from-body")
        return {"id": current_request_id()}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("boom")

    v9 = APIRouter()

    @v9.get("/infer")
    async def infer(model_name: str) -> dict[str, str]:
        return {"model": model_name}

    app.include_router(v9, prefix="/v9/models/{model_name}")
    install_observability(app, Settings())
    return app


def test_a_new_id_per_request_in_header_and_log(client: TestClient, logs: LogLines) -> None:
    logs.clear()
    first = client.get("/models/tiny")
    second = client.get("/models/tiny")
    ids = [first.headers["X-Request-ID"], second.headers["X-Request-ID"]]
    assert all(HEX_ID.fullmatch(i) for i in ids)
    assert ids[0] != ids[1]
    lines = logs.access()
    assert [line["request_id"] for line in lines] == ids
    line = lines[0]
    assert {k: line[k] for k in ("level", "msg", "method", "path", "route", "status", "model")} == {
        "level": "info",
        "msg": "request",
        "method": "GET",
        "path": "/models/tiny",
        "route": "/models/{name}",
        "status": 200,
        "model": "tiny",
    }
    assert isinstance(line["duration_ms"], float)
    assert line["duration_ms"] >= 0
    assert datetime.fromisoformat(line["ts"]).tzinfo is not None


@pytest.mark.parametrize("given", ["abc-123_x.y", "A" * 128])
def test_a_valid_incoming_id_is_kept(client: TestClient, logs: LogLines, given: str) -> None:
    logs.clear()
    response = client.get("/healthz", headers={"X-Request-ID": given})
    assert response.headers["X-Request-ID"] == given
    assert logs.access()[0]["request_id"] == given


@pytest.mark.parametrize("given", ["A" * 129, "bad id", "a/b", "", "ünï"])
def test_an_invalid_incoming_id_is_replaced(client: TestClient, logs: LogLines, given: str) -> None:
    logs.clear()
    response = client.get("/healthz", headers={b"X-Request-ID": given.encode("latin-1")})
    new = response.headers["X-Request-ID"]
    assert HEX_ID.fullmatch(new)
    assert logs.access()[0]["request_id"] == new


def test_failed_requests_keep_the_template_and_no_unknown_model(client: TestClient, logs: LogLines) -> None:
    logs.clear()
    assert client.get("/models/nope").status_code == 404
    too_big = client.post("/predict", content=b"x" * 4096, headers={"Content-Type": "application/json"})
    assert too_big.status_code == 413
    assert HEX_ID.fullmatch(too_big.headers["X-Request-ID"])
    missing, big = logs.access()
    assert (missing["route"], missing["status"], "model" in missing) == ("/models/{name}", 404, False)
    assert (big["route"], big["status"], big["path"]) == ("/predict", 413, "/predict")  # answered before routing


def test_routers_name_the_model_and_handlers_see_the_id(logs: LogLines) -> None:
    with TestClient(small_app()) as c:
        response = c.post("/run", headers={"X-Request-ID": "trace-1"})
        assert response.json() == {"id": "trace-1"}
        assert c.get("/v9/models/m7/infer").json() == {"model": "m7"}
    run, infer = logs.access()
    assert (run["model"], run["route"]) == ("from-body", "/run")
    assert (infer["model"], infer["route"]) == ("m7", "/v9/models/{model_name}/infer")
    assert current_request_id() is None


def test_an_unhandled_error_is_logged_as_500(logs: LogLines) -> None:
    with TestClient(small_app(), raise_server_exceptions=False) as c:
        assert c.get("/boom").status_code == 500
    (line,) = logs.access()
    assert (line["status"], line["level"], line["route"]) == (500, "error", "/boom")


def test_level_from_settings_and_one_handler(logs: LogLines) -> None:
    stream = io.StringIO()
    configure_logging(Settings(log_level="warning").log_level, stream=stream)
    configure_logging("warning", stream=stream)
    assert sum(isinstance(h, JsonHandler) for h in logging.getLogger().handlers) == 1
    log = logging.getLogger("hookserve.test")
    log.info("hidden")
    log.warning("shown %d", 7, extra={"model": "lenet"})
    logging.getLogger("uvicorn.error").warning("from uvicorn", extra={"color_message": "\x1b[1mfrom uvicorn"})
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(r["level"], r["logger"], r["msg"]) for r in lines] == [
        ("warning", "hookserve.test", "shown 7"),
        ("warning", "uvicorn.error", "from uvicorn"),
    ]
    assert lines[0]["model"] == "lenet"
    assert "color_message" not in lines[1]
    assert "request_id" not in lines[0]


def test_exceptions_become_one_field() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info())
    out = json.loads(JsonFormatter().format(record))
    assert out["msg"] == "failed here"
    assert out["exc"].startswith("Traceback")
    assert out["exc"].endswith("ValueError: bad")


def test_not_ready_is_a_warning_not_an_error(logs: LogLines, tmp_path: Path) -> None:
    """/readyz answers 503 while models load: expected load, not a server fault."""
    gate = tmp_path / "gate"
    (tmp_path / "gated.py").write_text(GATED_MODEL.format(gate=str(gate)))
    (tmp_path / "models.toml").write_text(GATED_TOML)
    settings = Settings(model_dir=tmp_path, config=tmp_path / "models.toml")
    with TestClient(create_app(settings)) as c:
        assert c.get("/readyz").status_code == 503
        gate.touch()
        # Left loading, the load would be abandoned and go on building its nn.Linear from torch's global
        # generator while the next module seeds it to build a reference model.
        wait_settled(c)
    (line,) = [entry for entry in logs.access() if entry["path"] == "/readyz"]
    assert (line["status"], line["level"]) == (503, "warning")


GATED_MODEL = """
import time
from pathlib import Path

from torch import nn


class Gated(nn.Linear):
    def __init__(self):
        while not Path({gate!r}).exists():
            time.sleep(0.01)
        super().__init__(4, 2)
"""

GATED_TOML = """
[[models]]
name = "gated"
source = "python"
architecture = "gated.py:Gated"
input_size = [4]
"""
