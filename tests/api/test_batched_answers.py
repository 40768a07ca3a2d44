"""Each request in a batch gets exactly its own rows: unequal sizes, tensor and container outputs.

The batches are made deterministically (`tests.helpers.held`): requests of 3, 1 and 2
samples queue, in that order, behind a held forward of a `Gated` model and then run as one
batch of 6. Every answer must equal the rows computed directly and the same request's
answer when it runs alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import httpx2
import pytest
import torch
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app
from tests.conftest import tensor_input, wait_settled
from tests.helpers.config import toy_entry
from tests.helpers.held import hold_rows, queued_behind_hold
from tests.helpers.models import WIDTH, Gate, new_gate, rows

SIZES = [3, 1, 2]  # not sorted: a split by sorted sizes would hand rows to the wrong request
KINDS = ["tensor", "tuple", "list", "dict", "nested"]
MODELS = {"predict": "tensor"} | {f"v2-{kind}": kind for kind in KINDS}  # each gate opens once: one model per test


@pytest.fixture(scope="module")
def gates() -> dict[str, tuple[str, Gate]]:
    return {model: new_gate() for model in MODELS}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, gates: dict[str, tuple[str, Gate]]) -> Iterator[TestClient]:
    """One `Gated` model per output kind; one worker thread, so queued requests wait for the held one."""
    model_dir = tmp_path_factory.mktemp("batched")
    config = "".join(
        toy_entry(
            model, "Gated", kwargs={"gate": key, "kind": MODELS[model]}, max_batch_size=64, max_batch_delay_ms=1000.0
        )
        for model, (key, _) in gates.items()
    )
    (model_dir / "models.toml").write_text(config)
    settings = Settings(model_dir=model_dir, config=model_dir / "models.toml", worker_threads=1, torch_threads=1)
    with TestClient(create_app(settings)) as c:
        wait_settled(c)
        yield c


def request_rows(index: int, size: int) -> torch.Tensor:
    """Distinct small integers for each request and row (exact in float32)."""
    first = sum(SIZES[:index])
    return (
        torch.arange(WIDTH, dtype=torch.float32) + 10 * torch.arange(first, first + size, dtype=torch.float32)[:, None]
    )


def predict(client: TestClient, model: str, x: torch.Tensor) -> httpx2.Response:
    body = {"model": model, "inputs": [tensor_input(row) for row in x], "include_logits": True, "top_k": WIDTH}
    return client.post("/predict", json=body)


def infer(client: TestClient, model: str, x: torch.Tensor) -> httpx2.Response:
    tensor = {"name": "input__0", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}
    return client.post(f"/v2/models/{model}/infer", json={"inputs": [tensor]})


def v2_outputs(response: httpx2.Response) -> list[torch.Tensor]:
    assert response.status_code == 200, response.text
    return [torch.tensor(o["data"]).reshape(o["shape"]) for o in response.json()["outputs"]]


def test_predictions_of_unequal_requests_in_one_batch_are_each_their_own(
    client: TestClient, gates: dict[str, tuple[str, Gate]]
) -> None:
    _, gate = gates["predict"]
    inputs = [request_rows(i, n) for i, n in enumerate(SIZES)]
    calls = [partial(predict, client, "predict", x) for x in inputs]
    held = queued_behind_hold(client, "predict", gate, partial(predict, client, "predict", hold_rows()), calls)
    assert gate.batch_sizes[-1] == sum(SIZES), f"not batched together: {gate.batch_sizes}"
    for x, answer in zip(inputs, held.answers, strict=True):
        assert answer.status_code == 200, answer.text
        logits = [p["logits"] for p in answer.json()["predictions"]]
        assert logits == rows(x)[0].tolist()
        alone = predict(client, "predict", x)
        assert alone.json() == answer.json()
    assert gate.batch_sizes[-len(SIZES) :] == SIZES  # the requests alone ran one by one


@pytest.mark.parametrize("kind", KINDS)
def test_every_output_of_unequal_requests_in_one_batch_is_each_their_own(
    client: TestClient, gates: dict[str, tuple[str, Gate]], kind: str
) -> None:
    """/v2 joins the dynamic batches; a tuple, list, dict or nested output is split per request too."""
    model = f"v2-{kind}"
    _, gate = gates[model]
    inputs = [request_rows(i, n) for i, n in enumerate(SIZES)]
    calls = [partial(infer, client, model, x) for x in inputs]
    held = queued_behind_hold(client, model, gate, partial(infer, client, model, hold_rows()), calls)
    assert gate.batch_sizes[-1] == sum(SIZES), f"not batched together: {gate.batch_sizes}"
    for x, answer in zip(inputs, held.answers, strict=True):
        got = v2_outputs(answer)
        expected: list[Any] = list(rows(x)) if kind != "tensor" else [rows(x)[0]]
        assert len(got) == len(expected)
        for name, (g, e) in enumerate(zip(got, expected, strict=True)):
            assert torch.equal(g, e), (f"output__{name}", g, e)
        alone = infer(client, model, x)
        assert alone.json()["outputs"] == answer.json()["outputs"]
