"""Every answer says `X-Content-Type-Options: nosniff`, whichever layer wrote it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app
from service.zoo.lenet import samples_dir
from tests.conftest import wait_settled, write_lenet


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("headers")
    (root / "models.toml").write_text(write_lenet(root))
    settings = Settings(model_dir=root, config=root / "models.toml", worker_threads=1, max_body_bytes=64 * 1024)
    with TestClient(create_app(settings)) as test_client:
        wait_settled(test_client)
        yield test_client


def digit() -> bytes:
    return (samples_dir() / "digit_7.png").read_bytes()


JSON = {"content-type": "application/json"}
ANSWERS = {
    "health": lambda c: c.get("/healthz"),
    "json": lambda c: c.get("/models"),
    "page": lambda c: c.get("/ui"),
    "docs": lambda c: c.get("/docs"),
    "openapi": lambda c: c.get("/openapi.json"),
    "metrics": lambda c: c.get("/metrics"),
    "png": lambda c: c.post(
        "/activations", data={"model": "lenet", "layers": "conv1", "format": "png"}, files={"image": digit()}
    ),
    "unknown model 404": lambda c: c.get("/models/nope"),
    "invalid field 422": lambda c: c.post("/predict", json={"model": "lenet", "inputs": [], "top_k": -1}),
    "body limit 413": lambda c: c.post(
        "/predict", content=b"x" * 100_000, headers={"content-type": "application/json"}
    ),
    "v2 error": lambda c: c.get("/v2/models/nope"),
    "no route 404": lambda c: c.get("/no/such/path"),
}


@pytest.mark.parametrize("case", ANSWERS)
def test_every_answer_says_nosniff(client: TestClient, case: str) -> None:
    response = ANSWERS[case](client)
    assert response.status_code > 0
    assert response.headers.get("x-content-type-options") == "nosniff", (case, response.status_code)
    assert len(response.headers.get_list("x-content-type-options")) == 1
